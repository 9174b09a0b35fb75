"""A float64-keeping eager attention for the references (imports nothing from probe).

transformers' eager attention of several families computes its softmax in float32;
probe runs float64 models with an attention that keeps float64.  The references run
the same arithmetic through this independent implementation, registered under its
own name with transformers' eager mask.
"""

from __future__ import annotations

import torch

NAME = "reference_eager"


def reference_eager(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs
):
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:
        # Each key/value head serves heads // kv_heads query heads.  Built as a broadcast
        # view like transformers' repeat_kv (a copy in another layout would change BLAS's
        # summation order, hence the last bits); left as they come when there is no group.
        b, _, t, d = key.shape
        shape = (b, kv_heads, heads // kv_heads, t, d)
        key = key[:, :, None].expand(shape).reshape(b, heads, t, d)
        value = value[:, :, None].expand(shape).reshape(b, heads, t, d)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if kwargs.get("position_bias") is not None:  # T5 adds its relative position bias here
        scores = scores + kwargs["position_bias"]
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        # GPT-OSS's eager attention (modeling_gpt_oss.eager_attention_forward): the head's
        # sink logit appended to every row as a last column, the row's maximum subtracted,
        # the softmax taken, the sink's column dropped (the row then sums to less than one).
        b, h, q, _ = scores.shape
        logits = torch.cat([scores, sinks.view(1, h, 1, 1).expand(b, h, q, 1)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = torch.softmax(logits, dim=-1, dtype=dtype)[..., :-1].to(query.dtype)
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs
    probs = torch.softmax(scores, dim=-1, dtype=dtype).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def register() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, reference_eager)
    AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
