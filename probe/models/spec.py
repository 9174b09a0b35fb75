"""A model family as data, and the one walker that executes it.

A :class:`Family` says where a family's layers are and lists, in forward order,
the *steps* one layer's forward offers to probe: reads (the attention
probabilities, the attention branch, a norm's input) and edits (what "remove the
attention skip" and "remove the MLP" mean there).  :class:`SpecAdapter` walks
any family's layers inside an nnsight trace and performs the steps an analysis
and an ablation ask for, so a new family is one entry in
``probe/models/families.py`` (plus its tiny test config), not a new class.

A step names a *site* inside a layer:

* ``"self_attn"`` or ``"attention.output.LayerNorm"``: a submodule, by its path from
  the layer (its ``.input``, ``.inputs``, ``.output``, or ``.skip``);
* ``":residual_0"``: an operation of the layer's own ``forward``, as nnsight's
  ``.source`` names it (``residual = hidden_states`` is ``residual_0``);
  ``"layer.0:attention_output_0"``: an operation of a submodule's ``forward``.

Every edit reaches the addition itself, never subtracts afterwards, so an ablated
layer equals module surgery to the last bit (``tests/reference/layers.py`` is that
surgery, written by hand).  The operation names are the most fragile lines of
the project: each family's entry names the transformers source line it binds to,
and :mod:`probe.check` verifies, on every model before any numbers are produced,
that the edits still mean what they say (a transformers release that renames an
operation fails there with one line, never with wrong numbers).

The residual-stream styles and the self-test identity each satisfies (x the
layer's input, b the attention branch, N the sublayer's norm for post-LN):

=========  ==========================================  =================  =================
style      layer                                       SAN output         SAN+skip output
=========  ==========================================  =================  =================
pre        h = x + b(x), y = h + mlp(h)                b                  x + b
post       a = N(x + b(x)), y = N'(a + mlp(a))         N(b)               N(x + b)
parallel   y = x + b(x) + mlp(x)                       b                  x + b
sandwich   h = x + N_post(b(x)), y = h + N(mlp(N(h)))  b (after N_post)   x + b
=========  ==========================================  =================  =================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ablate import Ablation
from ..errors import ProbeError
from .base import Adapter, LayerWeights, _first

#: When a step applies: always (reads), or only under one of the two removals.
WHEN = ("", "no_skip", "no_mlp", "norm_affine", "norm_removed")
ACTS = ("read", "zero", "set", "skip")
STYLES = ("pre", "post", "parallel", "sandwich")
#: How a norm scales a token: LayerNorm centres it, the RMS norms do not; Gemma's
#: RMSNorm multiplies by (1 + w) instead of w.
NORM_KINDS = ("layernorm", "rms", "rms+1")


@dataclass(frozen=True)
class Step:
    """One thing a layer's forward offers, at ``site`` (see the module docstring).

    ``act``:

    * ``read``: the value at ``part`` (``output``, ``input``) is kept under ``name``
      (element ``index`` of a tuple output);
    * ``zero``: the value at ``part`` is replaced by zeros of its shape;
    * ``set``: the value at ``part`` (``output``, ``input``, or ``argN`` for the N-th
      positional input) is replaced by ``value``;
    * ``skip``: the module does not run and returns ``value``.

    ``value`` is ``zeros`` (of the module's input shape), ``input`` (the module's own
    input), the name of an earlier read, or ``a+b``, the sum of two earlier reads in
    that order.  ``when`` says which removal the edit belongs to (reads: always).
    """

    site: str
    act: str = "read"
    part: str = "output"
    index: int | None = None
    value: str = ""
    name: str = ""
    when: str = ""

    def __post_init__(self) -> None:
        assert self.act in ACTS and self.when in WHEN, self
        assert (self.act == "read") == bool(self.name), self

    @property
    def module(self) -> str:
        return self.site.split(":", 1)[0]

    @property
    def op(self) -> str:
        return self.site.split(":", 1)[1] if ":" in self.site else ""

    def applies(self, ablation: Ablation) -> bool:
        return (
            not self.when
            or (self.when == "no_skip" and not ablation.attn_skip)
            or (self.when == "no_mlp" and not ablation.mlp)
            or (self.when == f"norm_{ablation.norm}")
        )

    def refs(self) -> tuple[str, ...]:
        """Earlier reads this edit's value needs."""
        if self.act == "read" or self.value in ("", "zeros", "input") or self.is_affine:
            return ()
        return tuple(self.value.split("+"))

    @property
    def is_affine(self) -> bool:
        return self.value.startswith("affine:")

    def describe(self) -> str:
        where = f"{self.site}.{self.part}" if self.act != "skip" else self.site
        if self.act == "zero":
            return f"{where} <- 0"
        if self.act == "set":
            return f"{where} <- {self.value}"
        if self.act == "skip":
            return f"{self.site} skipped, returns {self.value}"
        index = f"[{self.index}]" if self.index is not None else ""
        return f"{self.name} = {where}{index}"


def read(name: str, site: str, part: str = "output", index: int | None = None, when: str = ""):
    return Step(site, "read", part=part, index=index, name=name, when=when)


def zero(site: str, part: str = "output", when: str = "no_skip") -> Step:
    return Step(site, "zero", part=part, when=when)


def put(site: str, value: str, part: str = "output", when: str = "no_skip") -> Step:
    return Step(site, "set", part=part, value=value, when=when)


def skip(site: str, value: str, when: str = "no_mlp") -> Step:
    return Step(site, "skip", value=value, when=when)


@dataclass(frozen=True)
class Heads:
    """Where the value and output projections of the attention are (for the path decomposition).

    ``layout``: ``linear`` (``value`` and ``output`` are nn.Linear, y = x W^T + b),
    ``fused`` (``value`` is a fused q|k|v nn.Linear, blocks of H*d, KV*d, KV*d rows),
    ``neox`` (fused, interleaved per head: rows [q_h | k_h | v_h] for each head h),
    ``conv1d`` (GPT-2's Conv1D, y = x W + b, columns [q | k | v]).  Grouped-query
    attention repeats each key/value head for the query heads of its group, as
    transformers' ``repeat_kv`` does.
    """

    value: str
    output: str
    layout: str = "linear"


@dataclass(frozen=True)
class Family:
    """A model family as data (see the module docstring).

    ``steps`` may be a function of the config where the layer's code branches on it
    (OPT's pre- or post-LN, GPT-NeoX's parallel residual).  ``norm`` is the site of
    the norm the path decomposition freezes next to the attention (pre-LN: on the
    heads' input; post-LN: after the residual sum); ``branch_norm`` Gemma2's norm on
    the attention output before the residual sum.
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    style: str | Callable[[Any], str]
    steps: tuple[Step, ...] | Callable[[Any], tuple[Step, ...]]
    norm: str
    norm_kind: str
    heads: Heads | None
    skip_means: str
    mlp_means: str
    final_norm: str = ""
    #: The modules after the last layer that make the model's output, in order (default:
    #: the final norm); a missing or None one is passed over.
    output: tuple[str, ...] = ()
    lm_head: str = ""
    model_class: str = ""
    inputs: str = "ids"
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    #: HF's eager attention of this family computes the softmax in float32 even for
    #: float64 models; float64 runs then use probe's dtype-preserving eager attention.
    float32_softmax: bool = False
    causal: bool = False
    unused_modules: tuple[str, ...] = ()
    branch_norm: str = ""
    #: config -> why this configuration cannot be probed exactly ("" when it can).
    refuse: Callable[[Any], str] | None = None
    #: Where the family's operation names come from, for the one who must fix them.
    source_note: str = ""

    def output_modules(self) -> tuple[str, ...]:
        return self.output or ((self.final_norm,) if self.final_norm else ())

    def style_of(self, config) -> str:
        return self.style(config) if callable(self.style) else self.style

    def steps_of(self, config) -> tuple[Step, ...]:
        return self.steps(config) if callable(self.steps) else self.steps


class SpecAdapter(Adapter):
    """The walker: executes a :class:`Family` on any model of it."""

    def __init__(self, spec: Family) -> None:
        self.spec = spec
        self.family = spec.name
        self.model_types = spec.model_types
        self.unused_modules = spec.unused_modules
        self.forward_kwargs = dict(spec.forward_kwargs)
        self.inputs = spec.inputs
        self.norm_position = "post"  # per config: see norm_position_of
        self.table = (
            {"ablation": "no skip", "probe": spec.skip_means, "paper": _paper(spec)},
            {"ablation": "no MLP", "probe": spec.mlp_means, "paper": _paper(spec)},
        )
        self.paper_surgery = "not probed in the paper: --surgery paper applies probe's definition"
        if spec.name in ("bert",):
            self.paper_surgery = "the paper's surgery is probe's definition in this family"

    # --- configuration ------------------------------------------------------------
    def check(self, config) -> None:
        if self.spec.refuse is not None and (why := self.spec.refuse(config)):
            raise ProbeError(why)

    def style(self, config) -> str:
        return self.spec.style_of(config)

    def norm_position_of(self, config) -> str:
        return "post" if self.style(config) == "post" else "pre"

    @property
    def stream_note(self) -> str:  # type: ignore[override]
        return (
            "X_l is layer l's output as the next layer receives it (before any final norm); "
            "X_0 the first layer's input"
        )

    def describe(self, config) -> str:
        """The spec as text, one step a line, for ``probe models``, results and reports."""
        what = {"": "read", "no_skip": "no skip", "no_mlp": "no MLP"}
        lines = [f"layers: {self.spec.layers} ({self.style(config)} residual)"]
        lines += [
            f"{what[step.when] if step.act != 'read' else 'read'}: {step.describe()}"
            for step in self.spec.steps_of(config)
        ]
        lines.append(
            "LN-affine / no-LN: each norm inside the layer returns gamma x + beta / x "
            f"({self.spec.norm_kind})"
        )
        return "\n".join(lines)

    def norm_steps(self, model) -> tuple[Step, ...]:
        """The LN-affine and no-LN variants (``probe.ablate``) as steps on every norm module
        of a layer, in forward order.

        The norms are the layer's submodules of a norm class (LayerNorm, RMSNorm, T5's
        LayerNorm), except the query/key norms inside an attention (Qwen3, OLMo2), which
        are part of the attention's scores.  Their order is the order the layer registers
        them, which is their forward order in every family here (input norm before
        post-attention norm); a family where it is not would fail in nnsight's trace (an
        out-of-order access), never silently, and is tested against module surgery.
        """
        layer = _resolve_module(model, self.spec.layers)[0]
        sites = norm_sites(layer)
        affine = f"affine:{self.spec.norm_kind}"
        return tuple(skip(site, "input", when="norm_removed") for site in sites) + tuple(
            skip(site, affine, when="norm_affine") for site in sites
        )

    # --- inside a trace -----------------------------------------------------------
    def layers(self, root):
        return _resolve(root, self.spec.layers)

    def install(self, root) -> None:
        """Build nnsight's ``.source`` of every module an operation step names, outside a trace.

        nnsight raises OutOfOrderError when a layer's ``.source`` is first touched after
        that layer's forward began; installing every one up front removes that trap.
        """
        config = root._module.config
        modules = {step.module for step in self.spec.steps_of(config) if step.op}
        for layer in self.layers(root):
            for path in modules:
                _ = (_resolve(layer, path) if path else layer).source

    def walk(
        self, root, ablation: Ablation, wanted: frozenset[str] = frozenset()
    ) -> Iterator[dict[str, Any]]:
        """``{"x": X_0}``, then per layer the reads in ``wanted`` and ``"x"``: X_l.

        All reads and edits happen in forward order (nnsight's requirement), as the
        family's steps list them.
        """
        config = root._module.config
        steps = [s for s in self.spec.steps_of(config) if s.applies(ablation)]
        if ablation.norm != "kept":
            # The norm variants keep skip and MLP, so the spec's own edits do not apply; its
            # reads would interleave with the norms' order, so a norm run takes none.
            if wanted:
                raise ProbeError(
                    "the LayerNorm variants (LN-affine, no-LN) are measured by probe collapse only"
                )
            steps = [s for s in self.norm_steps(root._module) if s.applies(ablation)]
        needed = set(wanted) | {ref for s in steps for ref in s.refs()}
        layers = self.layers(root)
        yield {"x": _first(layers[0].input)}
        for layer in layers:
            values = _run_steps(layer, steps, needed)
            values["x"] = _first(layer.output)
            yield values

    def stream(self, root, tracer, ablation: Ablation) -> Iterator[torch.Tensor]:
        for values in self.walk(root, ablation):
            yield values["x"]

    def paths_stream(self, root, tracer, ablation: Ablation, norms: bool = True):
        wanted = {"probs"} | ({"norm", "branch_norm"} if norms else set())
        for i, values in enumerate(self.walk(root, ablation, frozenset(wanted))):
            if i == 0:
                yield values
                continue
            yield {
                "x": values["x"],
                "attn": values["probs"],
                "norm_input": values.get("norm") if norms else None,
                "branch_norm_input": values.get("branch_norm") if norms else None,
            }

    # --- weights (outside any trace) ----------------------------------------------
    def layer_weights(self, model, index: int) -> LayerWeights:
        spec, config = self.spec, model.config
        if spec.heads is None:
            raise ProbeError(f"the {spec.name} family has no path decomposition in probe")
        layer = _resolve_module(model, spec.layers)[index]
        heads = self.n_heads(config)
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        w_v, b_v, w_o, b_o = _value_output(layer, spec.heads, config, heads, kv_heads)
        norm = _resolve_module(layer, self.read_site(config, "norm") or spec.norm)
        gamma, beta, eps, kind = norm_params(norm, spec.norm_kind)
        extra = {}
        if branch := self.read_site(config, "branch_norm") or spec.branch_norm:
            g, _, e, k = norm_params(_resolve_module(layer, branch), spec.norm_kind)
            extra = {"branch_gamma": g, "branch_eps": e, "branch_kind": k}
        return LayerWeights(
            w_v=w_v,
            b_v=b_v,
            w_o=w_o,
            b_o=b_o,
            gamma=gamma,
            beta=beta,
            eps=eps,
            norm=self.norm_position_of(config),
            kind=kind,
            **extra,
        )

    def read_site(self, config, name: str) -> str:
        """The module whose value the step reading ``name`` takes, on this config ("" if none).

        The norm the decomposition freezes is the one whose input the walk reads, so its
        weights and its 1/sigma always come from the same module (Falcon's ``ln_attn`` or
        ``input_layernorm``, as the config says).
        """
        for step in self.spec.steps_of(config):
            if step.act == "read" and step.name == name:
                return step.module
        return ""

    def final_norm(self, model):
        if not self.spec.final_norm:
            return None
        module = _resolve_module(model, self.spec.final_norm, missing_ok=True)
        if module is None:
            return None
        gamma, beta, eps, kind = norm_params(module, self.spec.norm_kind)
        return gamma, beta, eps, kind

    def final_output(self, model, x: torch.Tensor) -> torch.Tensor:
        """The model's output from the last layer's output x: the modules after the last
        layer (final norm, OPT-350m's project_out), as the model runs them."""
        with torch.no_grad():
            for path in self.spec.output_modules():
                module = _resolve_module(model, path, missing_ok=True)
                if module is not None:
                    x = module(x)
        return x

    def output_projection(self, model) -> torch.Tensor | None:
        """(out, hidden) weight of a bias-free linear map after the final norm, if the model's
        output has one (OPT-350m's ``project_out``): the decomposition maps every path through it.
        """
        after = [
            _resolve_module(model, m, missing_ok=True)
            for m in self.spec.output_modules()
            if m != self.spec.final_norm
        ]
        after = [m for m in after if m is not None]
        if not after:
            return None
        if len(after) > 1 or not isinstance(after[0], torch.nn.Linear) or after[0].bias is not None:
            raise ProbeError(
                f"the {self.family} output ends in {type(after[-1]).__name__}, not one linear map; "
                "the path decomposition cannot carry it"
            )
        return after[0].weight.detach()

    def lm_head(self, model) -> torch.Tensor | None:
        """The tied input embeddings, where they are the LM head of the model's output."""
        if not self.spec.lm_head or not getattr(model.config, "tie_word_embeddings", False):
            return None
        module = _resolve_module(model, self.spec.lm_head, missing_ok=True)
        return None if module is None else module.weight.detach()

    def attention_probs(self, layer):  # the analyses read them through paths_stream
        raise NotImplementedError("spec families read attention through walk()")

    def norm_input(self, layer):
        raise NotImplementedError("spec families read norms through walk()")


def _paper(spec: Family) -> str:
    if spec.name == "bert":
        return "the same"
    return "not probed in the paper; probe's definition"


# --- running steps ----------------------------------------------------------------


def _run_steps(layer, steps: list[Step], needed: set[str]) -> dict[str, Any]:
    """Perform one layer's steps in order; the named reads that ``needed`` asks for."""
    reads: dict[str, Any] = {}
    fetched: dict[tuple[str, str], Any] = {}  # one request per location: nnsight serves it once

    def fetch(step: Step):
        key = (step.site, step.part)
        if key not in fetched:
            fetched[key] = _get(_site(layer, step), step.part)
        return fetched[key]

    for step in steps:
        if step.act == "read":
            if step.name in needed:
                value = fetch(step)
                reads[step.name] = value if step.index is None else value[step.index]
            continue
        target = _site(layer, step)
        if step.act == "skip":
            target.skip(_value(step, target, reads))
        elif step.act == "zero":
            _put(target, step.part, torch.zeros_like(_first(_get(target, step.part))))
        else:
            _put(target, step.part, _value(step, target, reads))
    return reads


def _value(step: Step, target, reads: dict[str, Any]):
    if step.is_affine:
        return affine_norm(target._module, step.value.split(":", 1)[1], _first(target.input))
    if step.value == "zeros":
        return torch.zeros_like(_first(target.input))
    if step.value == "input":
        return target.input
    names = step.value.split("+")
    value = reads[names[0]]
    for name in names[1:]:
        value = value + reads[name]
    return value


def _site(layer, step: Step):
    module = _resolve(layer, step.module) if step.module else layer
    return getattr(module.source, step.op) if step.op else module


def _get(target, part: str):
    if part == "output":
        return target.output
    if part == "input":
        return target.input
    if part.startswith("arg"):
        args, _ = target.inputs
        return args[int(part[3:])]
    raise AssertionError(part)


def _put(target, part: str, value) -> None:
    if part == "output":
        target.output = value
    elif part == "input":
        target.input = value
    elif part.startswith("arg"):
        args, kwargs = target.inputs
        args = list(args)
        args[int(part[3:])] = value
        target.inputs = (tuple(args), kwargs)
    else:
        raise AssertionError(part)


def _resolve(envoy, path: str):
    """The envoy at a dotted module path; nnsight serves a submodule named like one of its
    own properties (BERT's ``output``) as ``E_<name>``."""
    from nnsight.intervention.envoy import Envoy

    obj = envoy
    for part in path.split("."):
        if part.isdigit():
            obj = obj[int(part)]
        elif inspect.isdatadescriptor(getattr(Envoy, part, None)):
            obj = getattr(obj, f"{Envoy.OVERLOAD_PREFIX}{part}")
        else:
            obj = getattr(obj, part)
    return obj


def _resolve_module(module: torch.nn.Module, path: str, missing_ok: bool = False):
    obj = module
    for part in path.split("."):
        if part.isdigit():
            obj = obj[int(part)]
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        elif missing_ok:
            return None
        else:
            raise AttributeError(f"{type(module).__name__} has no module {path!r}")
    return obj


# --- norms ------------------------------------------------------------------------

#: Submodules named so inside an attention normalise queries or keys: part of the scores.
_QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_norm", "key_norm")


def is_norm(module: torch.nn.Module) -> bool:
    """A LayerNorm or RMS norm, by type (HF names every one of them ``...Norm``)."""
    return isinstance(module, torch.nn.LayerNorm | torch.nn.RMSNorm) or type(
        module
    ).__name__.endswith(("LayerNorm", "RMSNorm", "LayerNorm2d"))


def norm_sites(layer: torch.nn.Module) -> list[str]:
    """Paths of the norm modules inside one layer, in registration order (see ``norm_steps``)."""
    return [
        name
        for name, module in layer.named_modules()
        if name and is_norm(module) and name.rsplit(".", 1)[-1] not in _QK_NORMS
    ]


def affine_norm(module: torch.nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """A norm with its normalisation removed: gamma * x + beta (LayerNorm), w * x (RMSNorm),
    (1 + w) * x (Gemma's RMSNorm); x itself for a norm without weights."""
    gamma, beta, _, got = norm_params(module, kind)
    if got == "none":
        return x
    return x * gamma.to(x.dtype) + beta.to(x.dtype)


# --- weights ----------------------------------------------------------------------


def norm_params(
    module: torch.nn.Module, kind: str
) -> tuple[torch.Tensor, torch.Tensor, float, str]:
    """(gamma, beta, eps, kind) of a norm module as the frozen programme needs them.

    An ``nn.Identity`` (ModernBERT's first layer has no attention norm) is kind
    ``none``: gamma 1, beta 0.  Gemma's RMSNorm scales by (1 + w).
    """
    weight = getattr(module, "weight", None)
    if isinstance(module, torch.nn.Identity) or weight is None:
        return torch.ones(1), torch.zeros(1), 0.0, "none"
    gamma = weight.detach()
    if kind == "rms+1":
        gamma = 1.0 + gamma.to(torch.float64)
        kind = "rms"
    bias = getattr(module, "bias", None)
    beta = bias.detach() if isinstance(bias, torch.Tensor) else torch.zeros_like(gamma)
    eps = getattr(module, "eps", None)
    if eps is None:
        eps = module.variance_epsilon
    return gamma, beta, float(eps), kind


def _value_output(layer, heads: Heads, config, n_heads: int, kv_heads: int):
    """(w_v (H, hidden, d), b_v (H, d), w_o (H, d, hidden), b_o (hidden,)), per query head."""
    value = _resolve_module(layer, heads.value)
    output = _resolve_module(layer, heads.output)
    weight = value.weight.detach()
    bias = value.bias.detach() if getattr(value, "bias", None) is not None else None
    if heads.layout == "conv1d":  # y = x W + b, W (hidden, 3 hidden)
        hidden = weight.shape[0]
        weight, bias = weight[:, 2 * hidden :].T, bias[2 * hidden :]
        out_w = output.weight.detach().T  # Conv1D (H*d, hidden) -> as Linear (hidden, H*d)
    else:
        out_w = output.weight.detach()  # (hidden, H*d)
    hidden = out_w.shape[0]
    d = out_w.shape[1] // n_heads
    if heads.layout == "fused":  # rows [q (H d) | k (KV d) | v (KV d)]
        start = (n_heads + kv_heads) * d
        weight = weight[start : start + kv_heads * d]
        bias = None if bias is None else bias[start : start + kv_heads * d]
    elif heads.layout == "falcon":
        weight, bias, kv_heads = _falcon_value(weight, bias, config, n_heads, d)
    elif heads.layout == "neox":  # rows per head h: [q_h | k_h | v_h]
        weight = weight.reshape(n_heads, 3, d, -1)[:, 2].reshape(n_heads * d, -1)
        bias = None if bias is None else bias.reshape(n_heads, 3, d)[:, 2].reshape(-1)
        kv_heads = n_heads
    w_v = weight.T.reshape(hidden, kv_heads, d).permute(1, 0, 2)  # (KV, hidden, d)
    b_v = weight.new_zeros(kv_heads, d) if bias is None else bias.reshape(kv_heads, d)
    group = n_heads // kv_heads
    if group > 1:  # query head h reads key/value head h // group (transformers' repeat_kv)
        w_v = w_v.repeat_interleave(group, dim=0)
        b_v = b_v.repeat_interleave(group, dim=0)
    w_o = out_w.T.reshape(n_heads, d, hidden)  # (H, d, hidden)
    out_b = getattr(output, "bias", None)
    b_o = out_b.detach() if isinstance(out_b, torch.Tensor) else out_w.new_zeros(hidden)
    return w_v, b_v, w_o, b_o


#: The query and key projections beside a value projection named so (layout ``linear``).
_QK_SIBLINGS = {
    "value": ("query", "key"),
    "v_proj": ("q_proj", "k_proj"),
    "v_lin": ("q_lin", "k_lin"),
    "value_proj": ("query_proj", "key_proj"),
    "v": ("q", "k"),
}


def query_key(layer, heads: Heads, config, n_heads: int, kv_heads: int):
    """(w_q (H, hidden, d), w_k (H, hidden, d)) per query head, in the x W convention of
    ``_value_output`` (scores of head h: X w_q[h] w_k[h]^T X^T before the 1/sqrt(d) scale);
    a grouped key head repeated for the query heads of its group.  Read with the same
    layouts as the value weights; a layout without a known query/key place raises ProbeError.
    """
    value = _resolve_module(layer, heads.value)
    weight = value.weight.detach()
    if heads.layout == "conv1d":  # y = x W + b, columns [q | k | v]
        hidden = weight.shape[0]
        d = hidden // n_heads
        w_q, w_k, kv_heads = weight[:, :hidden], weight[:, hidden : 2 * hidden], n_heads
    else:
        out_w = _resolve_module(layer, heads.output).weight.detach()
        hidden = out_w.shape[0]
        d = out_w.shape[1] // n_heads
        if heads.layout == "linear":
            parent, _, name = heads.value.rpartition(".")
            if name not in _QK_SIBLINGS:
                raise ProbeError(f"no query/key projection known beside {heads.value}")
            q_name, k_name = _QK_SIBLINGS[name]
            prefix = f"{parent}." if parent else ""
            rows_q = _resolve_module(layer, prefix + q_name).weight.detach()
            rows_k = _resolve_module(layer, prefix + k_name).weight.detach()
        elif heads.layout == "fused":  # rows [q (H d) | k (KV d) | v (KV d)]
            rows_q = weight[: n_heads * d]
            rows_k = weight[n_heads * d : (n_heads + kv_heads) * d]
        elif heads.layout == "neox":  # rows per head h: [q_h | k_h | v_h]
            per_head = weight.reshape(n_heads, 3, d, -1)
            rows_q = per_head[:, 0].reshape(n_heads * d, -1)
            rows_k = per_head[:, 1].reshape(n_heads * d, -1)
            kv_heads = n_heads
        else:
            raise ProbeError(
                f"query/key weights of the {heads.layout} layout are not read by probe"
            )
        w_q, w_k = rows_q.T, rows_k.T  # (hidden, H d), (hidden, KV d)
    w_q = w_q.reshape(hidden, n_heads, d).permute(1, 0, 2)
    w_k = w_k.reshape(hidden, kv_heads, d).permute(1, 0, 2)
    if n_heads // kv_heads > 1:  # transformers' repeat_kv
        w_k = w_k.repeat_interleave(n_heads // kv_heads, dim=0)
    return w_q, w_k


def _falcon_value(weight, bias, config, n_heads: int, d: int):
    """The value rows of Falcon's fused query_key_value, as FalconAttention._split_heads reads it.

    New architecture: per key/value group [q x (H/KV) | k | v]; multi-query: [q (H d) | k | v];
    otherwise per head [q_h | k_h | v_h].
    """
    hidden = weight.shape[-1]
    if config.new_decoder_architecture:
        kv = config.num_kv_heads
        rows = weight.reshape(kv, n_heads // kv + 2, d, hidden)[:, -1].reshape(kv * d, hidden)
        b = None if bias is None else bias.reshape(kv, n_heads // kv + 2, d)[:, -1].reshape(-1)
        return rows, b, kv
    if config.multi_query:
        return weight[-d:], None if bias is None else bias[-d:], 1
    rows = weight.reshape(n_heads, 3, d, hidden)[:, 2].reshape(n_heads * d, hidden)
    b = None if bias is None else bias.reshape(n_heads, 3, d)[:, 2].reshape(-1)
    return rows, b, n_heads
