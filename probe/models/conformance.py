"""Does a family's entry describe the modules of this model?  Checked before any trace.

An entry (:class:`probe.models.family.Family`) is data about a model's modules: where its
layers, norms, projections and MLP are, what kind each is, and what the family computes
around its layers.  :func:`check_entry` holds that data against the model itself, on the
model's own weights and config, and refuses a mismatch in one line naming the family and
the field at fault:

* every site the entry names is a module of every layer (not None);
* the projections' shapes agree with the heads, the key/value heads and the layout the
  entry says (a ``fused`` layout on a plain ``v_proj`` is refused here);
* each norm it names computes the norm of its ``norm_kind`` (LayerNorm centres a token, the
  RMS norms do not, Gemma's scales by 1 + w), tried on a token with a mean far from zero;
* every norm inside a layer is named by the entry: as the norm, the branch norm, a site of
  its steps (or inside one), or a query/key norm (``qk_norms``, with every module inside
  it: StableLM's one LayerNorm per head); any other is refused by its path;
* a token-wise ``Mlp(first, second)`` is what its module computes, second(s(first(x))), and
  a gated MLP is not declared as one;
* every config value that changes the logits, the embeddings, the scores or the residual
  branches (Cohere's ``logit_scale``, Gemma2's final soft cap, Granite's four multipliers)
  is named by the entry's ``logits`` or multiplier fields.

What the walker's edits mean (the operation names) is checked by the self-test
(:mod:`probe.surgery.self_test`), which runs this first.
"""

from __future__ import annotations

import re

import torch

from ..errors import ProbeError
from .family import Family, Mlp, validate_config
from .weights import is_norm, norm_params, resolve_module, within

#: Config values that change what the model computes around its layers: attribute -> the
#: entry's field that must name it, and the value at which it changes nothing.
AROUND_LAYERS = {
    "logit_scale": ("logits", 1.0),
    "logits_scaling": ("logits", 1.0),
    "final_logit_softcapping": ("logits", None),
    "embedding_multiplier": ("embedding_multiplier", 1.0),
    "attention_multiplier": ("attention_multiplier", None),
    "residual_multiplier": ("residual_multiplier", 1.0),
}
#: How far a norm's output may be from its kind's formula, relative to the output's size:
#: float32 arithmetic inside the norm (Cohere, the RMS norms) in any dtype, or the dtype's
#: own rounding.  A wrong kind is off by the size of the output itself.
NORM_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}
NORM_TOLERANCE_DEFAULT = 1e-4
#: A path that reads as a norm of the queries or keys (q_norm, k_layernorm, query_norm).
_QK = re.compile(r"(^|\.)(q|k|query|key)_[a-z]*norm")


def check_entry(spec: Family, model: torch.nn.Module) -> None:
    """Refuse (one line naming the family and the field) an entry that does not describe
    ``model``; see the module docstring."""

    def fail(field: str, what: str) -> None:
        raise ProbeError(f"family entry {spec.name!r}: {field}: {what}")

    config = model.config
    validate_config(spec, config)
    _around_layers(spec, config, fail)
    try:
        layers = resolve_module(model, spec.layers)
    except AttributeError:
        fail("layers", f"{type(model).__name__} has no module {spec.layers!r}")
    if not isinstance(layers, torch.nn.ModuleList | torch.nn.Sequential) or not len(layers):
        fail("layers", f"{spec.layers!r} is not a list of layers in {type(model).__name__}")
    for layer in layers:
        _sites(spec, config, layer, fail)
        _unnamed_norms(spec, config, layer, fail)
    live = not any(p.is_meta for p in model.parameters())
    _heads(spec, config, layers[0], fail)
    _mlp_shapes(spec, config, layers[0], fail)
    if live:  # a meta model has no values to try: its sites and shapes are checked above
        with torch.no_grad():
            _norm_kinds(spec, config, layers, fail)
            _mlp_function(spec, config, layers[0], fail)


def _around_layers(spec: Family, config, fail) -> None:
    named = {
        "logits": spec.logits.fields(),
        "embedding_multiplier": (spec.embedding_multiplier,),
        "attention_multiplier": (spec.attention_multiplier,),
        "residual_multiplier": (spec.residual_multiplier,),
    }
    for attribute, (field, neutral) in AROUND_LAYERS.items():
        value = getattr(config, attribute, None)
        if value is None or value == neutral or attribute in named[field]:
            continue
        fail(
            field,
            f"the config's {attribute} ({value}) changes what the model computes, and the "
            f"entry's {field} does not name it",
        )


def _module(layer, path: str):
    try:
        return resolve_module(layer, path)
    except (AttributeError, IndexError, TypeError):
        return None


def _named_sites(spec: Family, config) -> dict[str, str]:
    """site path -> the entry's field that names it, for one layer of this config."""
    sites = {step.module: "steps" for step in spec.steps_of(config) if step.module}
    if norm := spec.norm_of(config):
        sites[norm] = "norm"
    if spec.branch_norm:
        sites[spec.branch_norm] = "branch_norm"
    if (heads := spec.heads_of(config)) is not None:
        sites[heads.value] = sites[heads.output] = "heads"
    mlp = spec.mlp_of(config)
    if not mlp.gated:
        sites[mlp.first] = sites[mlp.second] = "mlp"
    if module := spec.mlp_branch_of(config).split(":", 1)[0]:
        sites[module] = "mlp_branch"
    return sites


def _sites(spec: Family, config, layer, fail) -> None:
    for path, field in _named_sites(spec, config).items():
        if not isinstance(_module(layer, path), torch.nn.Module):
            fail(field, f"{path!r} is not a module of {type(layer).__name__}")


def _unnamed_norms(spec: Family, config, layer, fail) -> None:
    """A norm is named where a field names its path, or it sits inside a module a step
    skips (it goes with it) or inside a query/key norm; a norm inside a module the steps only
    read or edit (the attention) is not."""
    named = set(_named_sites(spec, config))
    skipped = tuple(s.module for s in spec.steps_of(config) if s.act == "skip") + spec.qk_norms
    for path, module in layer.named_modules():
        if path and is_norm(module) and path not in named and not within(path, skipped):
            fail(
                "qk_norms" if _QK.search(path) else "steps",
                f"{path} ({type(module).__name__}) is a norm of the layer that the entry does "
                "not name: a norm on the queries or keys belongs in qk_norms, any other in the "
                "steps (what no skip and no MLP do with it)",
            )


def _rows(module) -> int | None:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    return weight.shape[0]


def _heads(spec: Family, config, layer, fail) -> None:
    heads = spec.heads_of(config)
    if heads is None:
        return
    value, output = _module(layer, heads.value), _module(layer, heads.output)
    rows, out_rows = _rows(value), _rows(output)
    if rows is None or out_rows is None:
        fail("heads", f"{heads.value} and {heads.output} must be linear maps with a weight")
    # HF's attribute_map gives every family num_attention_heads (as Adapter.n_heads reads it).
    h = config.num_attention_heads
    kv = spec.kv_heads_of(config, h)
    conv = heads.layout == "conv1d"  # Conv1D stores (in, out): y = x W + b
    inner = output.weight.shape[0 if conv else 1]
    if inner % h:
        fail("heads", f"{heads.output} takes {inner} inputs, not a multiple of {h} heads")
    d = inner // h
    got = value.weight.shape[1] if conv else rows
    want, what = _value_rows(heads.layout, config, h, kv, d)
    if got != want or (conv and value.weight.shape[0] != output.weight.shape[1]):
        fail(
            "heads",
            f"layout {heads.layout!r} reads {heads.value} as {what}, {want} "
            f"{'columns' if conv else 'rows'}, but it has {got}",
        )


def _value_rows(layout: str, config, h: int, kv: int, d: int) -> tuple[int, str]:
    """The rows (GPT-2's Conv1D: columns) a value projection of ``layout`` has, and what
    they are, for ``h`` query heads and ``kv`` key/value heads of ``d``."""
    if layout == "falcon":  # FalconAttention._split_heads, by three config options
        if getattr(config, "new_decoder_architecture", False):
            kv = getattr(config, "num_kv_heads", kv)
            return (h + 2 * kv) * d, f"Falcon's rows, [q x {h // kv} | k | v] per group of {kv}"
        if getattr(config, "multi_query", False):
            return (h + 2) * d, f"Falcon's multi-query rows [q ({h} x {d}) | k ({d}) | v ({d})]"
        return 3 * h * d, f"Falcon's rows [q_h | k_h | v_h] for {h} heads of {d}"
    return {
        "linear": (kv * d, f"a value projection of {kv} key/value heads of {d}"),
        "fused": (
            (h + 2 * kv) * d,
            f"fused q|k|v rows [q ({h} x {d}) | k ({kv} x {d}) | v ({kv} x {d})]",
        ),
        "neox": (3 * h * d, f"fused rows [q_h | k_h | v_h] for {h} heads of {d}"),
        "conv1d": (3 * h * d, f"GPT-2's Conv1D columns [q | k | v] of {h} heads of {d}"),
    }[layout]


def _mlp_shapes(spec: Family, config, layer, fail) -> None:
    mlp = spec.mlp_of(config)
    if mlp.gated:
        return
    first, second = _module(layer, mlp.first), _module(layer, mlp.second)
    shapes = [getattr(m, "weight", None) for m in (first, second)]
    if any(not isinstance(w, torch.Tensor) or w.dim() != 2 for w in shapes):
        fail("mlp", f"{mlp.first} and {mlp.second} must be linear maps with a weight")
    (a_out, a_in), (b_out, b_in) = (
        w.shape if mlp.layout == "linear" else w.T.shape for w in shapes
    )
    if a_out != b_in or a_in != b_out:
        fail(
            "mlp",
            f"{mlp.first} ({a_in} -> {a_out}) and {mlp.second} ({b_in} -> {b_out}) are not the "
            f"two projections of one MLP in layout {mlp.layout!r}",
        )
    hidden = getattr(config, "hidden_size", None)
    if isinstance(hidden, int) and a_in != hidden and a_out == hidden:
        fail(
            "mlp",
            f"layout {mlp.layout!r} reads {mlp.first} as a map from {a_in} to {a_out}, but the "
            f"model's width is {hidden}: its weight is stored the other way round "
            "(nn.Linear: layout 'linear', GPT-2's Conv1D: 'conv1d')",
        )


def _norm_kinds(spec: Family, config, layers, fail) -> None:
    """Each norm the entry names, on the first layer where it is a norm (ModernBERT's first
    attention norm is an Identity), computes its kind's formula."""
    named = {
        path: field
        for path, field in _named_sites(spec, config).items()
        if field in ("norm", "branch_norm", "steps")
    }
    tried = set()
    for layer in layers:
        for path, field in named.items():
            module = _module(layer, path)
            if path in tried or not is_norm(module):
                continue
            tried.add(path)
            _one_norm(spec, module, f"{field} {path!r}", fail)


def _one_norm(spec: Family, module, where: str, fail) -> None:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return
    hidden = weight.shape[-1]
    dtype, device = weight.dtype, weight.device
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, hidden, generator=generator, dtype=torch.float64) + 3.0
    got = module(x.to(dtype=dtype, device=device)).to(torch.float64).cpu()
    gamma, beta, eps, kind = norm_params(module, spec.norm_kind)
    gamma, beta = gamma.to(torch.float64).cpu(), beta.to(torch.float64).cpu()
    centred = x - x.mean(-1, keepdim=True) if kind == "layernorm" else x
    scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    want = centred * scale * gamma + beta
    tolerance = NORM_TOLERANCE.get(dtype, NORM_TOLERANCE_DEFAULT)
    if float((got - want).abs().max()) > tolerance * float(want.abs().max()):
        fail(
            "norm_kind",
            f"{where} ({type(module).__name__}) does not compute a {spec.norm_kind} norm "
            "(layernorm centres each token, rms does not, rms+1 scales by 1 + w)",
        )


#: How far an MLP's output may be from second(s(first(x))) computed from its own modules,
#: relative to its size: the same operations in the same dtype, so a few units of the dtype
#: (an activation's other implementation).  A wrong activation (gelu for gelu_new: 1e-4 of
#: the output) or a gated MLP is off by far more, in any precision the run can resolve.
MLP_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 5e-3}
MLP_TOLERANCE_DEFAULT = 3e-2  # bfloat16


def _mlp_function(spec: Family, config, layer, fail) -> None:
    """A token-wise MLP whose two projections share a parent module computes
    second(s(first(x))) there, to the dtype's rounding; where they do not (BERT's
    intermediate and output, OPT's fc1 and fc2 on the layer itself) only their shapes are
    checked.  An MLP declared gated whose module is two chained projections that compute
    exactly that is a plain MLP, and refused as gated."""
    mlp = spec.mlp_of(config)
    if mlp.gated:
        _not_plain(spec, config, layer, fail)
        return
    parent_a, _, _ = mlp.first.rpartition(".")
    parent_b, _, _ = mlp.second.rpartition(".")
    if not parent_a or parent_a != parent_b:
        return
    if (
        _computes(layer, parent_a, mlp.first, mlp.second, mlp.layout, mlp.activation_of(config))
        is False
    ):
        fail(
            "mlp",
            f"{parent_a} does not compute {mlp.second}(s({mlp.first}(x))) with s = "
            f"{mlp.activation_of(config)!r} to the rounding of its dtype, the token-wise MLP "
            "the entry says: a gated MLP (s(x A) * (x B)) C is GATED_MLP, and a plain one "
            "needs its activation (Mlp's activation, where the config does not name it)",
        )


def _computes(layer, parent: str, first: str, second: str, layout: str, activation: str):
    """Does the module at ``parent`` compute second(s(first(x)))?  None where that cannot be
    told: a module not called on the hidden states alone (its shapes are all there is to
    check), or an output that overflows in the model's dtype (the self-test says so)."""
    from transformers.activations import ACT2FN

    module = _module(layer, parent)
    a, b = _module(layer, first), _module(layer, second)
    weight = a.weight
    hidden = weight.shape[1] if layout == "linear" else weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, hidden, generator=generator).to(weight.dtype).to(weight.device)
    try:
        got = module(x)
    except Exception:  # a module that is not called on the hidden states alone: shapes only
        return None
    got = got[0] if isinstance(got, tuple) else got
    if activation not in ACT2FN:
        return False
    want = b(ACT2FN[activation](a(x)))
    if not (torch.isfinite(want).all() and torch.isfinite(got).all()):
        return None
    scale = float(want.abs().max()) or 1.0
    tolerance = MLP_TOLERANCE.get(weight.dtype, MLP_TOLERANCE_DEFAULT)
    return got.shape == want.shape and float((got - want).abs().max()) <= tolerance * scale


def _not_plain(spec: Family, config, layer, fail) -> None:
    """The module a ``zeros`` skip stands for under "no MLP" (the MLP), where it holds exactly
    two linear maps that chain (hidden -> k -> hidden) and computes second(s(first(x))) with
    the config's activation, is a plain MLP: GATED_MLP would give the theory panel no
    Lipschitz constant for an MLP that has one."""
    sites = [s.module for s in spec.steps_of(config) if s.act == "skip" and s.value == "zeros"]
    for site in sites:
        module = _module(layer, site)
        if not isinstance(module, torch.nn.Module):
            continue
        maps = [
            (path, m)
            for path, m in module.named_modules()
            if path and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2
        ]
        if len(maps) != 2 or not isinstance(maps[0][1], torch.nn.Linear):
            continue
        (first, a), (second, b) = maps
        if a.weight.shape[0] != b.weight.shape[1] or a.weight.shape[1] != b.weight.shape[0]:
            continue
        activation = Mlp().activation_of(config)
        if (
            _computes(layer, site, f"{site}.{first}", f"{site}.{second}", "linear", activation)
            is True
        ):
            fail(
                "mlp",
                f"{site} computes {second}(s({first}(x))), a token-wise MLP, not a gated one: "
                f'declare mlp=Mlp("{site}.{first}", "{site}.{second}") (GATED_MLP is for '
                "(s(x A) * (x B)) C)",
            )
