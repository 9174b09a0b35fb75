"""Attention masks chosen by the run, applied at the attention core of every family.

Wu, Ajorlou, Wang, Jegelka and Jadbabaie (NeurIPS 2024) prove that pure masked
self-attention still collapses to rank one for every mask whose graph is quasi-strongly
connected, and that sparse or local masks slow the rate.  A :class:`Mask` names which keys a
query sees, whatever the model was trained with:

=====================  ====================================================  ============
name                   query i sees key j when                               paper's name
=====================  ====================================================  ============
``model``              the model's own mask (the default: nothing changes)
``bidirectional``      always                                                complete
``causal``             j <= i                                                causal
``window:W``           \\|i - j\\| <= W                                        sliding window
``causal-window:W``    i - W <= j <= i                                       uni-directional sliding window
=====================  ====================================================  ============

and never a padding key.  Every pattern holds the diagonal, so every real query sees a key.
The mask is applied in probe's eager attention (``probe_masked``, registered with
transformers' ``AttentionInterface``): the same computation as ``probe_eager`` with the
model's additive mask replaced by the chosen one, so the attention probabilities every
statistic reads are the masked ones.  Which keys are padding is read from the model's own
mask, whose diagonal is open exactly at the real tokens.  A family whose attention does not
go through the interface (it computes its own softmax), or that has no T x T attention (the
Fastformer's additive pooling), is refused in one line.

``causal`` on a model whose own mask is causal, and ``bidirectional`` on an encoder, (no
sliding window either way) is the model's own mask: the run is the unmasked run, and the
result says so.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from probe.errors import ProbeError
from probe.requests.checks import MAX_COUNT, clipped, integer

#: The mask names, in the order the help lists them; ``window`` and ``causal-window`` take
#: a width, ``window:W``.
KINDS = ("model", "bidirectional", "causal", "window", "causal-window")
WIDE = ("window", "causal-window")
#: How the paper names each mask.
PAPER_NAMES = {
    "bidirectional": "complete",
    "causal": "causal",
    "window": "sliding window",
    "causal-window": "uni-directional sliding window",
}
NAME = "probe_masked"

_ACTIVE: contextvars.ContextVar[Mask | None] = contextvars.ContextVar("probe_mask", default=None)


@dataclass(frozen=True)
class Mask:
    """Which keys each query sees (module docstring).

    Parameters
    ----------
    kind
        One of `model`, `bidirectional`, `causal`, `window`, `causal-window`.
    width
        W of `window` and `causal-window`: a whole number from 1; None for the others.
    """

    kind: str = "model"
    width: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProbeError(f"unknown mask {self.kind!r}; {CHOICES}")
        if (self.kind in WIDE) != (self.width is not None):
            raise ProbeError(
                f"mask {self.kind} takes a width, as {self.kind}:W"
                if self.kind in WIDE
                else f"mask {self.kind} takes no width"
            )
        width = self.width
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)):
            raise ProbeError(f"a mask's width is a whole number; got {width!r}")
        if width is not None and width < 1:
            raise ProbeError(
                f"mask {self.kind}:{width}: the width W counts the keys beside the diagonal; "
                "give W >= 1 (W = 0 would let each token see only itself)"
            )
        if width is not None and width > MAX_COUNT:
            raise ProbeError(
                f"mask {self.kind}:W: the width W is at most {MAX_COUNT} (no context is longer; "
                f"a window that holds every key is {'bidirectional' if self.kind == 'window' else 'causal'}); "
                f"got {clipped(str(width))}"
            )

    @property
    def text(self) -> str:
        """The mask as the command line and the result write it: `window:2`."""
        return self.kind if self.width is None else f"{self.kind}:{self.width}"

    @property
    def is_model(self) -> bool:
        return self.kind == "model"

    def allowed(self, tokens: int, device=None) -> torch.Tensor:
        """(tokens, tokens) bool: query i (row) may see key j (column), padding aside."""
        i = torch.arange(tokens, device=device)[:, None]
        j = torch.arange(tokens, device=device)[None, :]
        if self.kind == "bidirectional":
            return torch.ones(tokens, tokens, dtype=torch.bool, device=device)
        if self.kind == "causal":
            return j <= i
        if self.kind == "window":
            return (i - j).abs() <= self.width
        if self.kind == "causal-window":
            return (j <= i) & (j >= i - self.width)
        raise ProbeError("the model's own mask is the model's; it has no pattern of probe's")


CHOICES = "choose model, bidirectional, causal, window:W or causal-window:W (W >= 1)"
_SPELLING = re.compile(r"^([a-z-]+)(?::(.*))?$")


def parse_mask(text: str | Mask | None) -> Mask:
    """`"window:2"` -> `Mask("window", 2)`; None or `"model"`: the model's own mask."""
    if text is None:
        return Mask()
    if isinstance(text, Mask):
        return text
    if not isinstance(text, str):
        raise ProbeError(f"`mask` takes a mask's name; got {text!r}; {CHOICES}")
    found = _SPELLING.match(text.strip().lower())
    if found is None or found.group(1) not in KINDS:
        raise ProbeError(f"unknown mask {clipped(text)!r}; {CHOICES}")
    kind, width = found.group(1), found.group(2)
    if width is None:
        return Mask(kind)
    # ASCII digits, read as every whole number is (Mask says what W >= 1 means).
    return Mask(kind, integer(f"the width W of mask {kind}:W", width, None, MAX_COUNT))


def own_kind(probed) -> str | None:
    """The model's own mask as one of probe's: ``causal`` (a causal family) or
    ``bidirectional`` (an encoder), where no layer has a sliding window; else None."""
    config = probed.config
    sliding = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or ()
    if sliding or "sliding_attention" in layer_types:
        return None
    return "causal" if probed.adapter.causal else "bidirectional"


def effective(probed, mask: Mask) -> Mask:
    """The mask a run applies: the one the model already has (``causal`` on a causal model,
    ``bidirectional`` on an encoder) is the model's own."""
    if mask.width is None and not mask.is_model and mask.kind == own_kind(probed):
        return Mask()
    return mask


def same_run(probed, mask: Mask, tokens: int | None) -> Mask:
    """The mask that runs at ``tokens`` tokens per sequence (None: not known yet), the same
    for two masks that give one run: a window holding every token is the mask without one."""
    if mask.width is not None and tokens is not None and mask.width >= tokens - 1:
        mask = Mask("bidirectional" if mask.kind == "window" else "causal")
    return effective(probed, mask)


def note(probed, asked: Mask, tokens: int) -> str:
    """What the result says of its mask, in one sentence; "" for the model's own."""
    if asked.is_model:
        return ""
    if effective(probed, asked).is_model:
        return f"mask {asked.kind}: {probed.name}'s own mask is {asked.kind}, so the run is its own"
    paper = PAPER_NAMES[asked.kind]
    words = f"mask {asked.text} (the paper's {paper}) replaces {probed.name}'s own mask"
    if asked.width is not None and asked.width >= tokens - 1:
        whole = "bidirectional" if asked.kind == "window" else "causal"
        own = f", {probed.name}'s own" if same_run(probed, asked, tokens).is_model else ""
        words += f"; at {tokens} tokens the window holds every key, as {whole}{own}"
    if asked.kind in ("bidirectional", "window") and probed.adapter.causal:
        if probed.init == "pretrained":
            words += f"; {probed.name} was trained causal, not with this mask"
    return words


def check(probed, mask: Mask) -> None:
    """Refuse, in one line, a mask this model's attention cannot take.  ``probed`` is a
    loaded model, or anything with its ``name``, ``family``, ``config`` and ``adapter``
    (the preflight's, before any load)."""
    if mask.is_model or effective(probed, mask).is_model:
        return
    name, family = probed.name, getattr(probed, "family", probed.adapter.family)
    leave = "(leave `mask` at model)"
    if family == "fastformer":
        raise ProbeError(
            f"{name}: the Fastformer's additive pooling is not T x T attention; probe "
            f"cannot mask it {leave}"
        )
    if getattr(probed.config, "alibi", False):
        raise ProbeError(
            f"{name}: its ALiBi position biases are added with its own mask; probe cannot "
            f"replace one without the other {leave}"
        )
    if not _dispatches(probed):
        raise ProbeError(
            f"{name} ({family}): its attention computes its own softmax, outside "
            f"transformers' attention interface; probe cannot mask it {leave}"
        )


def _dispatches(probed) -> bool:
    """Whether the model's attention goes through transformers' attention interface: read
    from its modules, or, before a load, from the modelling code its config names."""
    from probe.models import attention

    model = getattr(probed, "model", None)
    if model is not None:
        return attention.dispatches(model)
    from transformers import AutoModel

    try:
        cls = AutoModel._model_mapping[type(probed.config)]
    except (KeyError, ValueError):  # a class transformers does not map: decided at the load
        return True
    return attention.code_dispatches(cls.__module__)


@contextlib.contextmanager
def applied(models, mask: Mask) -> Iterator[None]:
    """Run the models' forwards under ``mask`` (the model's own: nothing changes).

    Each model's attention implementation is ``probe_masked`` inside the block and what it
    was after it; the models are probe's own copies (``probe.loading``), never the caller's.
    """
    runs = [m for m in models if not effective(m, mask).is_model]
    if not runs:
        yield
        return
    register()
    saved = [m.model.config._attn_implementation for m in runs]
    token = _ACTIVE.set(mask)
    try:
        for m in runs:
            m.model.config._attn_implementation = NAME
        yield
    finally:
        _ACTIVE.reset(token)
        for m, implementation in zip(runs, saved, strict=True):
            m.model.config._attn_implementation = implementation


def additive(mask: Mask, own: torch.Tensor | None, batch: int, tokens: int, dtype, device):
    """The additive mask (batch, 1, tokens, tokens) of ``mask``: 0 where a query sees a key,
    the dtype's minimum elsewhere (transformers' eager convention); the padding keys are the
    ones the model's own mask (``own``) closes on its diagonal."""
    allowed = mask.allowed(tokens, device)[None, None].expand(batch, 1, tokens, tokens)
    if own is not None:
        diagonal = own[:, 0].diagonal(dim1=-2, dim2=-1)[:, :tokens]  # (batch, key)
        real = diagonal if own.dtype == torch.bool else diagonal == 0
        allowed = allowed & real[:, None, None, :]
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def probe_masked(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                 softcap=None, **kwargs):  # fmt: skip
    """``probe_eager`` with the model's additive mask replaced by the active one; the keys
    a no-sink edit closed in the model's mask (:func:`close_sinks`) are closed in it too."""
    from probe.models.attention import probe_eager

    mask = _ACTIVE.get()
    if mask is None:  # outside ``applied``: the model's own
        return probe_eager(
            module, query, key, value, attention_mask, scaling, dropout, softcap, **kwargs
        )
    tokens = key.shape[-2]
    if query.shape[-2] != tokens:
        raise ProbeError("a mask of probe's needs as many queries as keys (no cache)")
    base = getattr(attention_mask, BEFORE_SINKS, attention_mask)  # the model's, as it gave it
    chosen = additive(mask, base, query.shape[0], tokens, query.dtype, query.device)
    if (sinks := getattr(attention_mask, SINKS, None)) is not None:
        chosen = close_sinks(chosen, sinks)
    return probe_eager(module, query, key, value, chosen, scaling, dropout, softcap, **kwargs)


#: The attributes a no-sink edit leaves on the mask it hands the attention function: the
#: (1, head, 1, key) keys it closed and the mask before them, so that ``probe_masked``,
#: which replaces the model's mask, closes the same keys in the run's own.
SINKS, BEFORE_SINKS = "probe_sinks", "probe_before_sinks"


def visible(mask: torch.Tensor) -> torch.Tensor:
    """Where a mask transformers hands an attention function lets a query see a key: a bool
    mask as it is, an additive one where it is above half its dtype's minimum (its eager
    masks are 0 or the minimum)."""
    if not mask.dtype.is_floating_point:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def call_mask(args, kwargs):
    """The mask of an attention function's call, ``(module, q, k, v, mask, ...)``."""
    return args[4] if len(args) > 4 else kwargs.get("attention_mask")


def close_sinks(mask: torch.Tensor, remove: torch.Tensor) -> torch.Tensor:
    """The additive ``mask`` (batch, 1 or head, query, key) with the dtype's minimum at the
    keys ``remove`` (1, head, 1, key) marks, in each row that still sees another key (a row
    left with no key, a causal model's first token when it is a sink, keeps its mask).  The
    result carries ``remove`` and ``mask`` (:data:`SINKS`, :data:`BEFORE_SINKS`)."""
    low = torch.finfo(mask.dtype).min
    other = (visible(mask) & ~remove).any(-1, keepdim=True)  # (batch, head, row, 1)
    closed = torch.where(
        remove & other, torch.tensor(low, dtype=mask.dtype, device=mask.device), mask
    )
    setattr(closed, SINKS, remove)
    setattr(closed, BEFORE_SINKS, mask)
    return closed


def remove_sinks(target, sinks) -> torch.Tensor:
    """no-sink at an attention function's call: its mask gets the dtype's minimum at each
    (head, key) of ``sinks``, and learned sink logits (GPT-OSS's ``s_aux``) are left out, so
    exp underflows to exactly 0 there and the softmax renormalises each row over the other
    keys (:func:`close_sinks`: a
    row that sees no other key is left as it is; a mask of the run's own closes the same
    keys).  A key is visible where the mask is above half the dtype's minimum
    (transformers' eager mask: 0 or the minimum).  Returns the mask before the edit."""
    args, kwargs = target.inputs
    args = list(args)
    query, key = args[1], args[2]
    mask = call_mask(args, kwargs)
    batch, heads, rows, keys = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    given = mask
    dtype = query.dtype if mask is None or mask.dtype == torch.bool else mask.dtype
    low = torch.finfo(dtype).min
    if mask is None:
        mask = torch.zeros((batch, 1, rows, keys), dtype=dtype, device=query.device)
    elif mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, low).to(dtype)
    mask = mask[:, :, :, :keys]
    remove = torch.zeros((heads, keys), dtype=torch.bool, device=query.device)
    for head, k in sinks:
        if k < keys:
            remove[head, k] = True
    new = close_sinks(mask, remove[None, :, None, :])  # (1, head, 1, key)
    if kwargs.get("s_aux") is not None:  # learned sink logits (GPT-OSS): removed as well
        kwargs = {**kwargs, "s_aux": None}
    if len(args) > 4:
        args[4] = new
    else:
        kwargs = {**kwargs, "attention_mask": new}
    target.inputs = (tuple(args), kwargs)
    return given


#: What an attention read gives where the family's attention function was not reached (it
#: computes its own softmax): the run's mask is then its pattern, or the model's causality.
UNREAD = object()


def seen(run: Mask, real: torch.Tensor, given=UNREAD, causal: bool = False) -> torch.Tensor:
    """(batch, 1 or head, query, key) bool: the real query i saw the real key k in the run.

    ``run``: the mask the run applied (:func:`effective`); ``real``: (batch, token) bool;
    ``given``: the mask the family's attention function received, read at its call (an
    additive float mask, transformers' bool mask, or None for no mask), or :data:`UNREAD`.
    A mask of probe's is its pattern (``probe_masked`` replaces the model's; a no-sink edit's
    closed keys aside, which no statistic's run has); the model's own is what its attention
    function received, per layer, sliding windows and all (:func:`visible`); unread, the
    model's causality (a family with its own softmax has no window)."""
    real = real.bool()
    rows, keys = real[:, None, :, None], real[:, None, None, :]
    tokens = real.shape[1]
    if not run.is_model:
        open_ = run.allowed(tokens, real.device)[None, None]
    elif given is UNREAD:
        open_ = Mask("causal" if causal else "bidirectional").allowed(tokens, real.device)
        open_ = open_[None, None]
    elif given is None:
        open_ = torch.ones(1, 1, tokens, tokens, dtype=torch.bool, device=real.device)
    else:
        open_ = visible(getattr(given, BEFORE_SINKS, given)[..., :tokens, :tokens])
    return open_.to(real.device) & rows & keys


def register() -> str:
    """Make ``probe_masked`` known to transformers (once); its name."""
    from probe.models import attention

    return attention.register(NAME, probe_masked)


def attrs(probed, asked: Mask, tokens: int) -> dict:
    """The result's attributes of the attention that ran: ``attention`` (the implementation),
    ``causal`` (1 where a token saw only earlier ones), and, where a mask was asked for,
    ``mask`` and ``mask_note``; a run with the model's own mask has neither, so its file
    name (a hash of its settings) is the unmasked run's."""
    run = effective(probed, asked)
    causal = probed.adapter.causal if run.is_model else run.kind in ("causal", "causal-window")
    found = {
        "attention": probed.attn_implementation if run.is_model else NAME,
        "causal": int(causal),
    }
    if not asked.is_model:
        found |= {"mask": asked.text, "mask_note": note(probed, asked, tokens)}
    return found
