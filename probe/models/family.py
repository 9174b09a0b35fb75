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

import torch

from probe.surgery.ablate import Ablation

from ..errors import ProbeError

#: When a step applies: always (reads), or only under one of the removals.
WHEN = ("", "no_skip", "no_mlp", "norm_affine", "norm_removed", "sinks", "scaled")
ACTS = ("read", "zero", "set", "skip", "scale")
STYLES = ("pre", "post", "parallel", "sandwich")
#: How a norm scales a token: LayerNorm centres it, the RMS norms do not; Gemma's
#: RMSNorm multiplies by (1 + w) instead of w.
NORM_KINDS = ("layernorm", "rms", "rms+1")
#: How the attention's projections are laid out (see :class:`Heads`).
LAYOUTS = ("linear", "fused", "neox", "conv1d", "falcon")
#: How an MLP's two weight matrices are stored (see :class:`Mlp`).
MLP_LAYOUTS = ("linear", "conv1d")


@dataclass(frozen=True)
class Step:
    """One thing a layer's forward offers, at ``site`` (see the module docstring).

    ``act``:

    * ``read``: the value at ``part`` (``output``, ``input``) is kept under ``name``
      (element ``index`` of a tuple output);
    * ``zero``: the value at ``part`` is replaced by zeros of its shape;
    * ``set``: the value at ``part`` (``output``, ``input``, or ``argN`` for the N-th
      positional input) is replaced by ``value``;
    * ``skip``: the module does not run and returns ``value``;
    * ``scale``: the value at ``part`` (element ``index`` of a tuple) is multiplied by the
      run's branch scale alpha (:mod:`probe.surgery.scaling`); ``value`` names the read it replaces
      for later edits (``branch``).  The walker adds these steps itself (``when="scaled"``).

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
        if self.act not in ACTS:
            raise ProbeError(f"step at {self.site!r}: act {self.act!r} is not one of {ACTS}")
        if self.when not in WHEN:
            raise ProbeError(f"step at {self.site!r}: when {self.when!r} is not one of {WHEN}")
        if (self.act == "read") != bool(self.name):
            raise ProbeError(f"step at {self.site!r}: a read, and only a read, has a name")

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
            or (self.when == "sinks" and ablation.remove == "sinks")
            or (self.when == "scaled" and ablation.branch_scale != 1)
        )

    def refs(self) -> tuple[str, ...]:
        """Earlier reads this edit's value needs."""
        if self.act in ("read", "scale") or self.value in ("", "zeros", "input", "no-sink"):
            return ()
        if self.is_affine:  # the norm's own input
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
        if self.act == "scale":
            index = f"[{self.index}]" if self.index is not None else ""
            return f"{where}{index} <- alpha * {where}{index}"
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
    transformers' ``repeat_kv`` does.  ``kv_heads``: the number of key/value heads where the
    config does not give it as ``num_key_value_heads`` (GPT-BigCode's multi-query: 1); 0
    reads the config.  A layout that the config chooses is a function of the config in the
    entry's ``heads`` (:meth:`Family.heads_of`).
    """

    value: str
    output: str
    layout: str = "linear"
    kv_heads: int = 0


@dataclass(frozen=True)
class Mlp:
    """The MLP's weights the theory panel reads for Corollary 3.2's Lipschitz constant.

    A token-wise MLP x -> s(x A_1 + b_1) A_2 + b_2: ``first`` and ``second`` are the paths
    (from the layer) of its two projections, ``layout`` ``linear`` (nn.Linear, y = x W^T)
    or ``conv1d`` (GPT-2's Conv1D, y = x W); ``activation`` names s in transformers'
    ``ACT2FN`` where the config does not (BLOOM's tanh GELU).  ``gated``: a gated MLP
    (SwiGLU, GeGLU), which has no global Lipschitz constant (:data:`GATED_MLP`).
    """

    first: str = ""
    second: str = ""
    layout: str = "linear"
    activation: str = ""
    gated: bool = False

    def activation_of(self, config) -> str:
        """The name of s in transformers' ``ACT2FN``: the entry's, else the config's."""
        if self.activation:  # the family's entry names it where the config does not (BLOOM)
            return self.activation
        for key in ("hidden_act", "activation_function", "dense_act_fn", "activation"):
            value = getattr(config, key, None)
            if isinstance(value, str):
                return value
        return "gelu"


#: A gated MLP, (s(x A) * (x B)) C: it grows quadratically, so no Lipschitz constant.
GATED_MLP = Mlp(gated=True)


@dataclass(frozen=True)
class Logits:
    """What the family's language model does to ``hidden @ head^T`` to make its logits.

    Each field names the config attribute that holds the number, read from the model's own
    config at run time: ``multiply`` (Cohere's ``logit_scale``: logits * s), ``divide``
    (Granite's ``logits_scaling``: logits / s), ``softcap`` (Gemma2's
    ``final_logit_softcapping``: c tanh(logits / c)); applied in that order.  An analysis
    that reads logits or a loss (the path decomposition's loss) applies them as the family's
    LM does.
    """

    multiply: str = ""
    divide: str = ""
    softcap: str = ""

    def fields(self) -> tuple[str, ...]:
        return tuple(name for name in (self.multiply, self.divide, self.softcap) if name)

    def apply(self, config, logits):
        """``logits`` as the family's LM returns them (a config value of None: no step)."""
        multiply, divide, cap = (
            _number(config, name) for name in (self.multiply, self.divide, self.softcap)
        )
        if multiply is not None:
            logits = logits * multiply
        if divide is not None:
            logits = logits / divide
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits


def _number(config, name: str) -> float | None:
    value = getattr(config, name, None) if name else None
    return None if value is None else float(value)


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
    #: "" where the layer has no norm before its attention (OLMo2 normalises only the
    #: sublayers' outputs): the path decomposition then freezes no norm on the heads' input.
    #: A function of the config where the steps are (Falcon's ``ln_attn`` or
    #: ``input_layernorm``): it must name the module whose input the steps read as "norm".
    norm: str | Callable[[Any], str]
    norm_kind: str
    #: The value and output projections (a function of the config where it chooses them).
    heads: Heads | Callable[[Any], Heads] | None
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
    #: The site whose output is the MLP's contribution to the residual sum, as it is added
    #: (a function of the config where the layer branches): residual branch scaling
    #: (:mod:`probe.surgery.scaling`) multiplies it by alpha there.
    mlp_branch: str | Callable[[Any], str] = ""
    #: Where the family's operation names come from, for the one who must fix them.
    source_note: str = ""
    #: The MLP's weights for the theory panel (a function of the config where it branches).
    mlp: Mlp | Callable[[Any], Mlp] | None = None
    #: Paths (from the layer) of the norms on the queries and keys inside the attention
    #: (Qwen3, OLMo2): part of the scores, which the theory panel's W_QK leaves out.
    qk_norms: tuple[str, ...] = ()
    #: What else enters the attention scores that W_QK leaves out (a relative position
    #: bias, ALiBi, another scale), one sentence each, for the theory panel.
    score_notes: tuple[str, ...] = ()
    #: What the family's LM does to its logits beyond the head (:class:`Logits`).
    logits: Logits = Logits()
    #: Config attributes of the multipliers the family applies around its layers (Granite):
    #: X_0 = embeddings * ``embedding_multiplier`` (the walk reads X_0 after it); scores
    #: q k^T * ``attention_multiplier`` in place of 1/sqrt(d); each branch times
    #: ``residual_multiplier`` before its addition, y = x + m f(x) (the identities, the path
    #: decomposition and the theory panel take m from here).
    embedding_multiplier: str = ""
    attention_multiplier: str = ""
    residual_multiplier: str = ""

    def __post_init__(self) -> None:
        validate(self)

    def output_modules(self) -> tuple[str, ...]:
        return self.output or ((self.final_norm,) if self.final_norm else ())

    def style_of(self, config) -> str:
        return self.style(config) if callable(self.style) else self.style

    def steps_of(self, config) -> tuple[Step, ...]:
        return self.steps(config) if callable(self.steps) else self.steps

    def mlp_branch_of(self, config) -> str:
        return self.mlp_branch(config) if callable(self.mlp_branch) else self.mlp_branch

    def mlp_of(self, config) -> Mlp:
        return self.mlp(config) if callable(self.mlp) else self.mlp

    def heads_of(self, config) -> Heads | None:
        return self.heads(config) if callable(self.heads) else self.heads

    def kv_heads_of(self, config, n_heads: int) -> int:
        """The key/value heads of the attention: the entry's where it says, else the
        config's ``num_key_value_heads``, else one per query head."""
        heads = self.heads_of(config)
        given = heads.kv_heads if heads is not None else 0
        return given or getattr(config, "num_key_value_heads", None) or n_heads

    def norm_of(self, config) -> str:
        return self.norm(config) if callable(self.norm) else self.norm

    def branch_multiplier(self, config) -> float:
        """m of y = x + m f(x) (1 where the family adds its branches as they are)."""
        value = _number(config, self.residual_multiplier)
        return 1.0 if value is None else value


def validate(family: Family) -> None:
    """Refuse, in one line naming the family, an entry whose fields cannot mean anything.

    Checked when the entry is made (at registration), so a misspelled layout or a norm
    that no step reads fails on import with its name, not as a raw error inside a run.
    What depends on the config (``steps`` or ``style`` as functions) is checked on every
    model by the self-test (:mod:`probe.surgery.self_test`) instead.
    """

    def fail(what: str) -> None:
        raise ProbeError(f"family entry {family.name!r}: {what}")

    if not family.name or not family.model_types or not family.layers:
        fail("name, model_types and layers must be given")
    if not callable(family.style) and family.style not in STYLES:
        fail(f"style {family.style!r} is not one of {', '.join(STYLES)}")
    if family.norm_kind not in NORM_KINDS:
        fail(f"norm_kind {family.norm_kind!r} is not one of {', '.join(NORM_KINDS)}")
    heads = family.heads
    if heads is not None and not callable(heads):
        _validate_heads(heads, fail)
    if family.output and family.final_norm and family.final_norm not in family.output:
        fail(f"final_norm {family.final_norm!r} is not among the output modules {family.output}")
    if not family.mlp_branch:
        fail("mlp_branch is not given: the site whose output the MLP adds to the residual")
    if family.inputs not in ("ids", "pixels"):
        fail(f"inputs {family.inputs!r} is not ids or pixels")
    _validate_mlp(family.mlp, fail)
    if not callable(family.style) and family.style == "post" and not callable(family.norm):
        if not family.norm:
            fail("a post-LN family needs its norm: the sublayer's norm after the residual sum")
    if family.branch_norm and not callable(family.style) and family.style != "sandwich":
        fail("branch_norm (a norm on the attention's output) belongs to the sandwich style")
    if not isinstance(family.logits, Logits):
        fail(f"logits must be a Logits, not {type(family.logits).__name__}")
    if not callable(family.steps) and not callable(family.norm):
        _validate_steps(family, family.steps, family.norm, fail)


def validate_config(family: Family, config) -> None:
    """What :func:`validate` leaves to the config: the steps and the norm of this config."""

    def fail(what: str) -> None:
        raise ProbeError(f"family entry {family.name!r}: {what}")

    if callable(family.style) and family.style_of(config) not in STYLES:
        fail(f"style {family.style_of(config)!r} is not one of {', '.join(STYLES)}")
    _validate_steps(family, family.steps_of(config), family.norm_of(config), fail)
    if callable(family.heads):
        _validate_heads(family.heads_of(config), fail)
    if callable(family.mlp):
        _validate_mlp(family.mlp_of(config), fail)


def _validate_heads(heads, fail) -> None:
    if not isinstance(heads, Heads):
        fail(f"heads must be a Heads, not {type(heads).__name__}")
    if heads.layout not in LAYOUTS:
        fail(f"Heads layout {heads.layout!r} is not one of {', '.join(LAYOUTS)}")
    if not heads.value or not heads.output:
        fail("Heads needs the value and the output projection's paths")
    if not isinstance(heads.kv_heads, int) or heads.kv_heads < 0:
        fail(f"Heads kv_heads {heads.kv_heads!r} is not a whole number (0: the config's)")


def _validate_mlp(mlp, fail) -> None:
    if mlp is None:
        fail("mlp is not given: Mlp(first, second) for a token-wise MLP, GATED_MLP for a gated one")
    if callable(mlp):
        return
    if not isinstance(mlp, Mlp):
        fail(f"mlp must be an Mlp, not {type(mlp).__name__}")
    if not mlp.gated and not (mlp.first and mlp.second):
        fail("Mlp needs the paths of its two projections (or GATED_MLP)")
    if mlp.layout not in MLP_LAYOUTS:
        fail(f"Mlp layout {mlp.layout!r} is not one of {', '.join(MLP_LAYOUTS)}")


def _validate_steps(family: Family, steps: tuple[Step, ...], norm: str, fail) -> None:
    """The reads every analysis needs, each norm read where the entry says it is, and every
    edit's value an earlier read."""
    reads: dict[str, str] = {}
    for step in steps:
        if not isinstance(step, Step):
            fail(f"steps must be Step values (read, zero, put, skip), not {step!r}")
        missing = [ref for ref in step.refs() if ref not in reads]
        if missing:
            fail(f"the step `{step.describe()}` uses {', '.join(missing)} before it is read")
        if step.act == "read":
            reads[step.name] = step.module
    for name in ("probs", "branch"):
        if name not in reads:
            fail(f"no step reads {name!r} (the attention probabilities and the attention branch)")
    if norm and reads.get("norm", norm) != norm:
        fail(f"norm is {norm!r} but the step reading 'norm' reads {reads['norm']!r}")
    if norm and "norm" not in reads:
        fail(f"norm is {norm!r} but no step reads its input as 'norm'")
    if not norm and "norm" in reads:
        fail(f"norm is '' (no norm before the attention) but a step reads {reads['norm']!r}")
    if family.branch_norm and reads.get("branch_norm") != family.branch_norm:
        fail(f"branch_norm is {family.branch_norm!r} but no step reads its input as 'branch_norm'")
