"""Reading a family's weights and norms from the model's own modules, outside any trace.

The path decomposition (:mod:`probe.measures.frozen`) and the theory panel (:mod:`probe.measures.theory`)
need each attention's value, output, query and key projections per head, and each
norm's (gamma, beta, eps); the LayerNorm variants need a norm's affine map.  Where a
family keeps them is its entry's business (:class:`probe.models.family.Heads`:
``layout``); this module reads every layout probe knows.
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import ProbeError
from .family import Heads


def resolve_module(module: torch.nn.Module, path: str, missing_ok: bool = False):
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


def norm_sites(layer: torch.nn.Module, qk_norms: tuple[str, ...] = ()) -> list[str]:
    """Paths of the norm modules inside one layer, in registration order (see ``norm_steps``),
    without the query/key norms: those named so, and ``qk_norms`` (the entry's) with every
    module inside them (StableLM's one LayerNorm per head, ``q_layernorm.norms.0``)."""
    return [
        name
        for name, module in layer.named_modules()
        if name
        and is_norm(module)
        and name.rsplit(".", 1)[-1] not in _QK_NORMS
        and not within(name, qk_norms)
    ]


def layer_norm_sites(layers, qk_norms: tuple[str, ...] = ()) -> list[str]:
    """The norm sites of every layer (:func:`norm_sites`; a site that is a norm in any layer:
    ModernBERT's first layer has an Identity where the others have ``attn_norm``), in the
    order the layer's ``forward`` calls them (:func:`forward_order`)."""
    sites: list[str] = []
    for layer in layers:
        sites += [site for site in norm_sites(layer, qk_norms) if site not in sites]
    return forward_order(layers[0], sites)


def forward_order(layer: torch.nn.Module, sites: list[str]) -> list[str]:
    """``sites`` in the order ``layer.forward`` first calls their top-level submodules
    (``self.input_layernorm(``), read from its source; registration order where the source
    does not call each of them itself (BERT's MLP runs in a helper method)."""
    import inspect

    try:
        source = inspect.getsource(type(layer).forward)
    except (OSError, TypeError):
        return sites
    position = {site: source.find(f"self.{site.split('.', 1)[0]}(") for site in sites}
    if any(at < 0 for at in position.values()):
        return sites
    return sorted(sites, key=lambda site: position[site])  # stable: nested sites keep order


def within(path: str, roots) -> bool:
    """Is the module at ``path`` one of ``roots`` or inside one of them?"""
    return any(path == root or path.startswith(f"{root}.") for root in roots if root)


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


def value_output(layer, heads: Heads, config, n_heads: int, kv_heads: int):
    """(w_v (H, hidden, d), b_v (H, d), w_o (H, d, hidden), b_o (hidden,)), per query head."""
    value = resolve_module(layer, heads.value)
    output = resolve_module(layer, heads.output)
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
    ``value_output`` (scores of head h: X w_q[h] w_k[h]^T X^T before the 1/sqrt(d) scale);
    a grouped key head repeated for the query heads of its group.  Read with the same
    layouts as the value weights; a layout without a known query/key place raises ProbeError.
    """
    value = resolve_module(layer, heads.value)
    weight = value.weight.detach()
    if heads.layout == "conv1d":  # y = x W + b, columns [q | k | v]
        hidden = weight.shape[0]
        d = hidden // n_heads
        w_q, w_k, kv_heads = weight[:, :hidden], weight[:, hidden : 2 * hidden], n_heads
    else:
        out_w = resolve_module(layer, heads.output).weight.detach()
        hidden = out_w.shape[0]
        d = out_w.shape[1] // n_heads
        if heads.layout == "linear":
            parent, _, name = heads.value.rpartition(".")
            if name not in _QK_SIBLINGS:
                raise ProbeError(f"no query/key projection known beside {heads.value}")
            q_name, k_name = _QK_SIBLINGS[name]
            prefix = f"{parent}." if parent else ""
            rows_q = resolve_module(layer, prefix + q_name).weight.detach()
            rows_k = resolve_module(layer, prefix + k_name).weight.detach()
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


@contextlib.contextmanager
def module_onloaded(module: torch.nn.Module):
    """One module's offloaded weights brought in for the block, for code that reads them
    after accelerate's hook has sent them back (a forward hook); a no-op for a module whose
    weights are where they run."""
    if getattr(module, "_hf_hook", None) is None:
        yield module
        return
    from accelerate.utils import align_module_device, has_offloaded_params

    if not has_offloaded_params(module):
        yield module
        return
    with align_module_device(module):
        yield module
