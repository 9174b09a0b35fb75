"""Where the brute-force path oracle reads each family: the record and its readers.

No ``probe`` imports: every entry is written from the transformers source of its
family, never from probe's spec, so it checks that spec independently.  An entry
(:class:`Reference`) says where a layer's attention sublayer is (the layer list, the
attention module and the index of its probabilities in its output, the norm to
freeze) and how to read its parameters per *query* head (``params``: a grouped-query
head reads the key/value head of its group, h // (H / KV)) and the norm after the
last layer that belongs to the output (``final``).

The readers (``params``, ``final``) are the functions below; each family's
:class:`Reference` is part of its entry in ``ENTRIES`` of ``tests/reference/families.py``,
where a new family's goes (none for a Llama-shaped layer: a layer with ``self_attn``,
``input_layernorm``, ``post_attention_layernorm`` and ``mlp`` of any model_type shares
Llama's).  A family without one fails its own tests (:func:`reference_for` raises
:class:`NoReference` inside them), never the collection of the others'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import AlbertModel

F64 = torch.float64


def f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(F64)


@dataclass
class Norm:
    """A norm to freeze.  ``float32``: a LayerNorm that HF computes in float32 even in a
    float64 model (CohereLayerNorm), so the real run carries float32 rounding that the frozen
    (float64, linear) network cannot reproduce; HF's RMS norms all do, which kind "rms"
    says already."""

    kind: str  # "layer", "rms" or "none"
    gamma: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    eps: float = 0.0
    float32: bool = False


@dataclass
class Layer:
    """One attention sublayer: per head (W_v (hidden, d), b_v (d,), W_o (d, hidden)), b_o."""

    heads: list
    b_o: torch.Tensor
    norm: Norm
    where: str  # "post" or "pre"
    branch: Norm | None = None  # Gemma2's and OLMo2's norm on the attention output


@dataclass(frozen=True)
class Reference:
    """How the oracle reads one family (see the module docstring).

    ``norm``: the path (from the layer) of the norm to freeze, a function of the config
    where the family branches (Falcon), or "" where the heads read the layer's input
    (OLMo2); ``branch``: a norm on the attention's output; ``decoder``: the forward takes
    ``use_cache=False`` (a one-shot forward, as probe makes it); ``kwargs``: other forward
    arguments the reads need (DeBERTa-v2 returns its probabilities only when asked).
    """

    layers: str
    attention: str
    probs: int
    norm: str | Callable
    params: Callable[[torch.nn.Module, int], Layer]
    final: Callable[[torch.nn.Module], Norm | None] = lambda model: None
    branch: str | None = None
    decoder: bool = False
    kwargs: dict = field(default_factory=dict)

    def norm_of(self, config) -> str:
        return self.norm(config) if callable(self.norm) else self.norm


class NoReference(LookupError):
    """A family without its reference entry: its own tests fail with this."""


def layer_norm(module) -> Norm:
    bias = getattr(module, "bias", None)
    beta = f64(bias) if bias is not None else torch.zeros(module.weight.shape, dtype=F64)
    return Norm("layer", f64(module.weight), beta, float(module.eps))


def rms(module, plus_one: bool = False) -> Norm:
    eps = getattr(module, "variance_epsilon", None)
    eps = module.eps if eps is None else eps
    gamma = f64(module.weight)
    return Norm("rms", 1.0 + gamma if plus_one else gamma, None, float(eps))


def cohere_norm(module) -> Norm:
    """CohereLayerNorm: centred and scaled like a LayerNorm, no bias, eps ``variance_epsilon``,
    computed in float32 (its input and weight cast to float32, the result cast back)."""
    beta = torch.zeros(module.weight.shape, dtype=F64)
    return Norm("layer", f64(module.weight), beta, float(module.variance_epsilon), float32=True)


def no_bias(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=F64)


def rows_of(linear, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (hidden, d), b (d,)) of the output rows ``rows`` of an nn.Linear."""
    w = f64(linear.weight[rows]).T
    b = f64(linear.bias[rows]) if linear.bias is not None else no_bias(len(rows))
    return w, b


def per_head(value_rows, out, n_heads: int, d: int):
    """Heads from a function h -> value rows and an nn.Linear output projection."""
    heads = []
    for h in range(n_heads):
        w_v, b_v = rows_of(*value_rows(h))
        w_o = f64(out.weight[:, h * d : (h + 1) * d]).T  # (d, hidden)
        heads.append((w_v, b_v, w_o))
    b_o = f64(out.bias) if out.bias is not None else no_bias(out.weight.shape[0])
    return heads, b_o


def span(start: int, d: int) -> list[int]:
    return list(range(start, start + d))


def linear_layer(attn_value, attn_out, n_heads, d, kv_heads=None):
    """Separate value projection; query head h reads key/value head h // (H / KV)."""
    kv_heads = kv_heads or n_heads
    group = n_heads // kv_heads
    return per_head(lambda h: (attn_value, span((h // group) * d, d)), attn_out, n_heads, d)


def decoder_dims(config):
    n = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // n
    return n, d, getattr(config, "num_key_value_heads", None) or n


# --- the families ---------------------------------------------------------------------


def _bert(model, index: int) -> Layer:
    config = model.config
    if isinstance(model, AlbertModel):
        att = model.encoder.albert_layer_groups[0].albert_layers[0].attention
        value, dense, ln = att.value, att.dense, att.LayerNorm
    else:
        att = model.encoder.layer[index].attention
        value, dense, ln = att.self.value, att.output.dense, att.output.LayerNorm
    n = config.num_attention_heads
    heads, b_o = linear_layer(value, dense, n, value.weight.shape[0] // n)
    return Layer(heads, b_o, layer_norm(ln), "post")


def _xlnet(model, index: int) -> Layer:
    rel = model.layer[index].rel_attn
    heads = [
        (f64(rel.v[:, h, :]), no_bias(rel.v.shape[2]), f64(rel.o[:, h, :]).T)
        for h in range(rel.v.shape[1])
    ]
    return Layer(heads, no_bias(rel.v.shape[0]), layer_norm(rel.layer_norm), "post")


def _gpt2(model, index: int) -> Layer:
    block, config = model.h[index], model.config
    hidden, n = config.n_embd, config.n_head
    d = hidden // n
    w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: y = x W + b
    proj = block.attn.c_proj
    heads = [
        (
            f64(w[:, 2 * hidden + h * d : 2 * hidden + (h + 1) * d]),
            f64(b[2 * hidden + h * d : 2 * hidden + (h + 1) * d]),
            f64(proj.weight[h * d : (h + 1) * d, :]),
        )
        for h in range(n)
    ]
    return Layer(heads, f64(proj.bias), layer_norm(block.ln_1), "pre")


def _deberta(model, index: int) -> Layer:
    att = model.encoder.layer[index].attention
    n = model.config.num_attention_heads
    d = att.self.value_proj.weight.shape[0] // n
    heads, b_o = linear_layer(att.self.value_proj, att.output.dense, n, d)
    return Layer(heads, b_o, layer_norm(att.output.LayerNorm), "post")


def _distilbert(model, index: int) -> Layer:
    block = model.transformer.layer[index]
    n = model.config.n_heads
    heads, b_o = linear_layer(
        block.attention.v_lin, block.attention.out_lin, n, model.config.dim // n
    )
    return Layer(heads, b_o, layer_norm(block.sa_layer_norm), "post")


def _llama(model, index: int) -> Layer:
    kind = model.config.model_type
    block = model.layers[index]
    n, d, kv = decoder_dims(model.config)
    attn = block.self_attn
    if kind == "phi3":  # fused rows [q (n d) | k (kv d) | v (kv d)]
        group = n // kv
        heads, b_o = per_head(
            lambda h: (attn.qkv_proj, span((n + kv) * d + (h // group) * d, d)), attn.o_proj, n, d
        )
    else:
        heads, b_o = linear_layer(attn.v_proj, attn.o_proj, n, d, kv)
    gemma = kind in ("gemma", "gemma2", "gemma3_text")
    if isinstance(block.input_layernorm, torch.nn.LayerNorm):  # Starcoder2
        norm = layer_norm(block.input_layernorm)
    else:
        norm = rms(block.input_layernorm, plus_one=gemma)
    sandwich = kind in ("gemma2", "gemma3_text")
    branch = rms(block.post_attention_layernorm, plus_one=True) if sandwich else None
    return Layer(heads, b_o, norm, "pre", branch)


def _llama_final(model) -> Norm:
    if model.config.model_type in ("gemma", "gemma2", "gemma3_text"):
        return rms(model.norm, plus_one=True)
    if isinstance(model.norm, torch.nn.LayerNorm):  # Starcoder2
        return layer_norm(model.norm)
    return rms(model.norm)


def _separate(model, index: int, output: str = "o_proj", norm=layer_norm) -> Layer:
    """A layer whose attention has its own v_proj and an output projection ``output``, read
    after the ``norm`` of its ``input_layernorm``."""
    block = model.layers[index]
    n, d, kv = decoder_dims(model.config)
    attn = block.self_attn
    heads, b_o = linear_layer(attn.v_proj, getattr(attn, output), n, d, kv)
    return Layer(heads, b_o, norm(block.input_layernorm), "pre")


def _phi(model, index: int) -> Layer:
    # PhiAttention: q_proj, k_proj, v_proj and the output projection `dense`, all with biases.
    return _separate(model, index, "dense")


def _gpt_bigcode(model, index: int) -> Layer:
    # GPTBigCodeAttention: an nn.Linear c_attn; multi-query splits its rows (hidden, d, d),
    # multi-head views them per head as [q_h | k_h | v_h].
    block, config = model.h[index], model.config
    n = config.num_attention_heads
    d = config.hidden_size // n
    if config.multi_query:
        value = span(config.hidden_size + d, d)
        return Layer(*per_head(lambda h: (block.attn.c_attn, value), block.attn.c_proj, n, d),
                     layer_norm(block.ln_1), "pre")  # fmt: skip
    heads, b_o = per_head(
        lambda h: (block.attn.c_attn, span(h * 3 * d + 2 * d, d)), block.attn.c_proj, n, d
    )
    return Layer(heads, b_o, layer_norm(block.ln_1), "pre")


def _olmo2(model, index: int) -> Layer:
    # Olmo2DecoderLayer: h = x + post_attention_layernorm(attn(x)): no norm before the heads.
    block = model.layers[index]
    n, d, kv = decoder_dims(model.config)
    heads, b_o = linear_layer(block.self_attn.v_proj, block.self_attn.o_proj, n, d, kv)
    return Layer(heads, b_o, Norm("none"), "pre", rms(block.post_attention_layernorm))


def _stablelm(model, index: int) -> Layer:
    # StableLmAttention: separate v_proj (biased with use_qkv_bias), o_proj without bias.  The
    # per-head q/k LayerNorms touch queries and keys only, which the probabilities hold.
    return _separate(model, index)


def _cohere(model, index: int) -> Layer:
    # CohereDecoderLayer: a parallel layer (its MLP removed here) with one CohereLayerNorm.
    return _separate(model, index, norm=cohere_norm)


def _granite(model, index: int) -> Layer:
    # GraniteDecoderLayer adds the attention's output times residual_multiplier m: m is folded
    # into every head's W_o and into b_o, so the layer is x + sum_h heads_h(N(x)) as Llama's.
    block = model.layers[index]
    n, d, kv = decoder_dims(model.config)
    heads, b_o = linear_layer(block.self_attn.v_proj, block.self_attn.o_proj, n, d, kv)
    m = block.residual_multiplier
    heads = [(w_v, b_v, w_o * m) for w_v, b_v, w_o in heads]
    return Layer(heads, b_o * m, rms(block.input_layernorm), "pre")


def _bloom(model, index: int) -> Layer:
    # BloomAttention._reshape: fused rows per head h [q_h | k_h | v_h].
    block = model.h[index]
    n = model.config.num_attention_heads
    d = model.config.hidden_size // n
    fused = block.self_attention.query_key_value
    heads, b_o = per_head(
        lambda h: (fused, span(h * 3 * d + 2 * d, d)), block.self_attention.dense, n, d
    )
    return Layer(heads, b_o, layer_norm(block.input_layernorm), "pre")


def _opt(model, index: int) -> Layer:
    block, config = model.decoder.layers[index], model.config
    n = config.num_attention_heads
    d = config.hidden_size // n
    heads, b_o = linear_layer(block.self_attn.v_proj, block.self_attn.out_proj, n, d)
    where = "pre" if config.do_layer_norm_before else "post"
    return Layer(heads, b_o, layer_norm(block.self_attn_layer_norm), where)


def _opt_final(model) -> Norm | None:
    module = model.decoder.final_layer_norm  # None for post-LN (350m)
    return None if module is None else layer_norm(module)


def _gptj(model, index: int) -> Layer:
    block = model.h[index]
    n = model.config.n_head
    heads, b_o = linear_layer(block.attn.v_proj, block.attn.out_proj, n, model.config.n_embd // n)
    return Layer(heads, b_o, layer_norm(block.ln_1), "pre")


def _falcon_norm(config) -> str:
    two = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
    return "ln_attn" if two else "input_layernorm"


def _falcon(model, index: int) -> Layer:
    block, config = model.h[index], model.config
    n = config.num_attention_heads
    d = config.hidden_size // n
    fused = block.self_attention.query_key_value
    if config.new_decoder_architecture:  # per kv group g: [q x (n/kv) | k | v]
        per = n // config.num_kv_heads
        rows = lambda h: span((h // per) * (per + 2) * d + (per + 1) * d, d)  # noqa: E731
    elif config.multi_query:  # [q (n d) | k (d) | v (d)]
        rows = lambda h: span((n + 1) * d, d)  # noqa: E731
    else:  # per head [q_h | k_h | v_h]
        rows = lambda h: span(h * 3 * d + 2 * d, d)  # noqa: E731
    heads, b_o = per_head(lambda h: (fused, rows(h)), block.self_attention.dense, n, d)
    return Layer(heads, b_o, layer_norm(getattr(block, _falcon_norm(config))), "pre")


def _neox(model, index: int) -> Layer:
    block = model.layers[index]
    n = model.config.num_attention_heads
    d = model.config.hidden_size // n
    fused = block.attention.query_key_value  # per head [q_h | k_h | v_h]
    heads, b_o = per_head(
        lambda h: (fused, span(h * 3 * d + 2 * d, d)), block.attention.dense, n, d
    )
    return Layer(heads, b_o, layer_norm(block.input_layernorm), "pre")


def _modernbert(model, index: int) -> Layer:
    block = model.layers[index]
    n = model.config.num_attention_heads
    d = model.config.hidden_size // n
    fused = block.attn.Wqkv  # [q (n d) | k (n d) | v (n d)]
    heads, b_o = per_head(lambda h: (fused, span(2 * n * d + h * d, d)), block.attn.Wo, n, d)
    ln = block.attn_norm
    norm = Norm("none") if isinstance(ln, torch.nn.Identity) else layer_norm(ln)
    return Layer(heads, b_o, norm, "pre")


def _t5(model, index: int) -> Layer:
    sa = model.encoder.block[index].layer[0]
    config = model.config
    heads, b_o = linear_layer(sa.SelfAttention.v, sa.SelfAttention.o, config.num_heads, config.d_kv)
    return Layer(heads, b_o, rms(sa.layer_norm), "pre")


def _vit(model, index: int) -> Layer:
    block = model.layers[index]
    n = model.config.num_attention_heads
    d = model.config.hidden_size // n
    heads, b_o = linear_layer(block.attention.v_proj, block.attention.o_proj, n, d)
    return Layer(heads, b_o, layer_norm(block.layernorm_before), "pre")


def reference_for(model) -> Reference:
    """The path reference of ``model``'s family, from its entry in
    ``tests/reference/families.py``; :class:`NoReference` where it has none."""
    # Imported here: families.py imports this module for the readers it lists.
    from tests.reference.families import entry_for

    return entry_for(model).reference
