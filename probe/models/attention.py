"""An eager attention that keeps the model's precision, for float64 runs.

HuggingFace's eager attention in Llama, Mistral, Qwen, Gemma, Phi3, OPT, GPT-NeoX,
ModernBERT, ViT and (from transformers 5.24) GPT-J computes its softmax in float32
(``softmax(scores, dtype=float32)``, or scores from float32 queries and keys): a float64 model's
attention rows then sum to one only to ~1e-7, and a pure-attention (SAN) run stops
collapsing there (Llama at 24 layers: 5.3e-7) instead of going on to 1e-16.

``probe_eager`` is that same eager computation, operation for operation
(``q k^T * scaling``, the optional tanh soft-cap, T5's ``+ position_bias``, ``+ mask``,
GPT-OSS's learned sink logit as one more column (``s_aux``: the row's maximum taken out, the
softmax over keys and sink, the sink's column dropped, so a row sums to less than one),
softmax, ``@ v``),
with the softmax in the promoted type of the query and float32: float32, bfloat16
and float16 models get exactly what HF's eager gives them (the tests assert bitwise
equality in float32), and float64 models stay in float64.  It is registered through
transformers' ``AttentionInterface`` and its mask through ``AttentionMaskInterface``
as the eager mask (a float mask with the causal, padding and sliding-window
pattern already in it), so the model's masks, norms and rotary embeddings run as
transformers wrote them: nothing else of the model changes.
"""

from __future__ import annotations

import weakref
from functools import cache

import torch

NAME = "probe_eager"
#: The attention modules probe_eager has run in.  A family whose attention computes its
#: own softmax (BLOOM) never calls it, whatever the config asks for: what ran is recorded
#: from here (:func:`ran`), not from the config's flag.
_CALLED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def probe_eager(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention output (batch, token, head, d), probabilities (batch, head, token, token));
    ``s_aux``: learned sink logits (head,), whose share of each row goes to no key."""
    _CALLED.add(module)
    group = query.shape[1] // key.shape[1]
    if group > 1:  # grouped-query attention: key/value head j serves query heads j*g .. j*g+g-1
        key, value = _repeat(key, group), _repeat(value, group)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (batch, head, query, key)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if kwargs.get("position_bias") is not None:  # T5's relative position bias, before the mask
        scores = scores + kwargs["position_bias"]
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    softmax_dtype = torch.promote_types(query.dtype, torch.float32)
    if s_aux is not None:  # GPT-OSS: one more logit per head, a column no value stands for
        sinks = s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
        scores = torch.cat([scores, sinks.to(scores.dtype)], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=softmax_dtype)
    if s_aux is not None:
        probs = probs[..., :-1]  # the sink's column: its share of the row goes to no key
    probs = probs.to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return out, probs


def learned_sinks(model: torch.nn.Module) -> bool:
    """Whether the model's attention has learned sink logits: a per-head parameter
    ``sinks`` that its attention passes its function as ``s_aux`` (GPT-OSS), so each row's
    probabilities over the keys sum to less than one."""
    return any(
        isinstance(getattr(module, "sinks", None), torch.nn.Parameter) for module in model.modules()
    )


def _repeat(x: torch.Tensor, group: int) -> torch.Tensor:
    """(batch, kv_head, token, d) -> (batch, kv_head * group, token, d), as transformers'
    ``repeat_kv`` builds it (an expanded view, reshaped): the same memory layout, hence the
    same BLAS path and rounding as HF's eager attention."""
    batch, heads, tokens, d = x.shape
    return x[:, :, None].expand(batch, heads, group, tokens, d).reshape(batch, -1, tokens, d)


def ran(model: torch.nn.Module) -> str:
    """The attention that runs in ``model``, from the code, not from the config's flag.

    ``probe_eager`` where it was called in one of the model's modules; before any run,
    where the model's attention code looks its function up in transformers'
    ``AttentionInterface`` (and so will call it).  Otherwise what transformers' eager
    path runs: the config asked for ``probe_eager``, but the family's attention computes
    its own softmax (BLOOM's never dispatches on the config), so the label is ``eager``.
    """
    asked = str(getattr(model.config, "_attn_implementation", None) or "eager")
    if asked != NAME:
        return asked
    modules = list(model.modules())
    if any(module in _CALLED for module in modules):
        return NAME
    return NAME if dispatches(model) else "eager"


def dispatches(model: torch.nn.Module) -> bool:
    """Whether the model's attention code looks its function up in transformers'
    ``AttentionInterface`` (and so will call the one the config names)."""
    return any(code_dispatches(type(module).__module__) for module in model.modules())


@cache
def code_dispatches(module_name: str) -> bool:
    """Whether a modelling module's code calls transformers' attention interface."""
    import inspect
    import sys

    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(sys.modules[module_name])
    except (KeyError, OSError, TypeError):  # a module without source: it does not dispatch
        return False


_registered: set[str] = set()


def register(name: str = NAME, function=None) -> str:
    """Make ``attn_implementation=name`` known to transformers (once): ``function`` (default
    :func:`probe_eager`) as its attention and transformers' eager mask as its mask; the
    name."""
    if name not in _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask

        AttentionInterface.register(name, function or probe_eager)
        AttentionMaskInterface.register(name, eager_mask)
        _registered.add(name)
    return name
