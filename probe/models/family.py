"""A model family as data: where its layers are, and the steps one layer's forward offers.

A :class:`Family` says where a family's layers are and lists, in forward order,
the *steps* one layer's forward offers to probe: reads (the attention
probabilities, the attention branch, a norm's input) and edits (what "remove the
attention skip" and "remove the MLP" mean there).  The walker
(:class:`probe.models.spec.SpecAdapter`) executes any entry, so a new family is one
entry in ``probe/models/families.py`` (plus its tiny test config and its reference
entry), not a new class.

A step names a *site* inside a layer:

* ``"self_attn"`` or ``"attention.output.LayerNorm"``: a submodule, by its path from
  the layer (its ``.input``, ``.inputs``, ``.output``, or ``.skip``);
* ``":residual_0"``: an operation of the layer's own ``forward``, as nnsight's
  ``.source`` names it (``residual = hidden_states`` is ``residual_0``);
  ``"layer.0:attention_output_0"``: an operation of a submodule's ``forward``.

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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..ablate import Ablation

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
