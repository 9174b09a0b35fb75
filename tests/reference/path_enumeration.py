"""Brute-force sum over paths of a frozen SAN+skip network (no ``probe`` imports).

The oracle for ``probe.frozen.path_terms``.  Given a HuggingFace base model of any
family probe decomposes, the embeddings X_0 and, per layer, the attention
probabilities and the input of each norm to freeze (from one real run of the SAN+skip
variant: :func:`reference_reads` makes that run itself, by module surgery), it

* reads every head's value and output projection straight from the family's own
  modules (:func:`layer_params`, written per family below, per *query* head: a
  grouped-query head reads the key/value head of its group, h // (H / KV));
* walks each of the (H+1)^L paths one layer at a time, applying either the skip
  branch or the one head the path chooses, with every bias and norm shift left out
  (those belong to the constant);
* sums the paths of each length k;
* computes the constant as the frozen network applied to zero embeddings.

The frozen norms, with s the per-token scale read from the norm's real input u:

==========  =====================================  ==================================
kind        s                                       N(z)
==========  =====================================  ==================================
layer       1 / sqrt(var(u) + eps)                  (z - mean(z)) s gamma [+ beta]
rms         1 / sqrt(mean(u^2) + eps)               z s gamma (Gemma: gamma = 1 + w)
none        (ModernBERT's first layer: Identity)    z
==========  =====================================  ==================================

Per layout (x the layer's input, heads_h the frozen head h, N the frozen norm):
post-LN (BERT, RoBERTa, ELECTRA, DeBERTa-v2, DistilBERT, ALBERT, XLNet, OPT-350m) a
layer is N(x + sum_h heads_h(x)); pre-LN (GPT-2, Llama, Mistral, Qwen2/3, Gemma, Phi3,
OPT-125m, ModernBERT, T5, ViT, and the parallel GPT-J, GPT-NeoX, Falcon, whose MLP is
removed) is x + sum_h heads_h(N(x)); Gemma2's sandwich is x + P(sum_h heads_h(N(x)))
with its post-attention norm P frozen too.  A final norm (GPT-2's ln_f, Llama's norm,
T5's final_layer_norm, ...), frozen from the last layer's output, is applied to
every path.  Everything is float64.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from functools import partial

import torch
from transformers import AlbertModel, BertModel, GPT2Model, XLNetModel

F64 = torch.float64


def _d(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(F64)


@dataclass
class Norm:
    kind: str  # "layer", "rms" or "none"
    gamma: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    eps: float = 0.0


@dataclass
class Layer:
    """One attention sublayer: per head (W_v (hidden, d), b_v (d,), W_o (d, hidden)), b_o."""

    heads: list
    b_o: torch.Tensor
    norm: Norm
    where: str  # "post" or "pre"
    branch: Norm | None = None  # Gemma2's norm on the attention output


def _layer_norm(module) -> Norm:
    bias = getattr(module, "bias", None)
    beta = _d(bias) if bias is not None else torch.zeros(module.weight.shape, dtype=F64)
    return Norm("layer", _d(module.weight), beta, float(module.eps))


def _rms(module, plus_one: bool = False) -> Norm:
    eps = getattr(module, "variance_epsilon", None)
    eps = module.eps if eps is None else eps
    gamma = _d(module.weight)
    return Norm("rms", 1.0 + gamma if plus_one else gamma, None, float(eps))


def _no_bias(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=F64)


def _rows(linear, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (hidden, d), b (d,)) of the output rows ``rows`` of an nn.Linear."""
    w = _d(linear.weight[rows]).T
    b = _d(linear.bias[rows]) if linear.bias is not None else _no_bias(len(rows))
    return w, b


def _per_head(value_rows, out, n_heads: int, d: int):
    """Heads from a function h -> value rows and an nn.Linear output projection."""
    heads = []
    for h in range(n_heads):
        w_v, b_v = _rows(*value_rows(h))
        w_o = _d(out.weight[:, h * d : (h + 1) * d]).T  # (d, hidden)
        heads.append((w_v, b_v, w_o))
    b_o = _d(out.bias) if out.bias is not None else _no_bias(out.weight.shape[0])
    return heads, b_o


def _span(start: int, d: int) -> list[int]:
    return list(range(start, start + d))


def _linear_layer(attn_value, attn_out, n_heads, d, kv_heads=None):
    """Separate value projection; query head h reads key/value head h // (H / KV)."""
    kv_heads = kv_heads or n_heads
    group = n_heads // kv_heads
    return _per_head(lambda h: (attn_value, _span((h // group) * d, d)), attn_out, n_heads, d)


def _decoder_dims(config):
    n = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // n
    return n, d, getattr(config, "num_key_value_heads", None) or n


def layer_params(model, index: int) -> Layer:
    """The frozen-able parameters of layer ``index``, read from the family's own modules."""
    config = model.config
    kind = config.model_type
    if isinstance(model, BertModel | AlbertModel) or kind in ("bert", "roberta", "electra"):
        if isinstance(model, AlbertModel):
            att = model.encoder.albert_layer_groups[0].albert_layers[0].attention
            value, dense, ln = att.value, att.dense, att.LayerNorm
        else:
            att = model.encoder.layer[index].attention
            value, dense, ln = att.self.value, att.output.dense, att.output.LayerNorm
        n = config.num_attention_heads
        heads, b_o = _linear_layer(value, dense, n, value.weight.shape[0] // n)
        return Layer(heads, b_o, _layer_norm(ln), "post")
    if isinstance(model, XLNetModel):
        rel = model.layer[index].rel_attn
        heads = [
            (_d(rel.v[:, h, :]), _no_bias(rel.v.shape[2]), _d(rel.o[:, h, :]).T)
            for h in range(rel.v.shape[1])
        ]
        return Layer(heads, _no_bias(rel.v.shape[0]), _layer_norm(rel.layer_norm), "post")
    if isinstance(model, GPT2Model):
        block = model.h[index]
        hidden, n = config.n_embd, config.n_head
        d = hidden // n
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: y = x W + b
        proj = block.attn.c_proj
        heads = [
            (
                _d(w[:, 2 * hidden + h * d : 2 * hidden + (h + 1) * d]),
                _d(b[2 * hidden + h * d : 2 * hidden + (h + 1) * d]),
                _d(proj.weight[h * d : (h + 1) * d, :]),
            )
            for h in range(n)
        ]
        return Layer(heads, _d(proj.bias), _layer_norm(block.ln_1), "pre")
    if kind == "deberta-v2":
        att = model.encoder.layer[index].attention
        n = config.num_attention_heads
        d = att.self.value_proj.weight.shape[0] // n
        heads, b_o = _linear_layer(att.self.value_proj, att.output.dense, n, d)
        return Layer(heads, b_o, _layer_norm(att.output.LayerNorm), "post")
    if kind == "distilbert":
        block = model.transformer.layer[index]
        n = config.n_heads
        heads, b_o = _linear_layer(
            block.attention.v_lin, block.attention.out_lin, n, config.dim // n
        )
        return Layer(heads, b_o, _layer_norm(block.sa_layer_norm), "post")
    if kind in _LLAMA_KINDS or _llama_shaped(model):
        block = model.layers[index]
        n, d, kv = _decoder_dims(config)
        attn = block.self_attn
        if kind == "phi3":  # fused rows [q (n d) | k (kv d) | v (kv d)]
            group = n // kv
            heads, b_o = _per_head(
                lambda h: (attn.qkv_proj, _span((n + kv) * d + (h // group) * d, d)),
                attn.o_proj,
                n,
                d,
            )
        else:
            heads, b_o = _linear_layer(attn.v_proj, attn.o_proj, n, d, kv)
        gemma = kind in ("gemma", "gemma2")
        if isinstance(block.input_layernorm, torch.nn.LayerNorm):  # Starcoder2
            norm = _layer_norm(block.input_layernorm)
        else:
            norm = _rms(block.input_layernorm, plus_one=gemma)
        branch = _rms(block.post_attention_layernorm, plus_one=True) if kind == "gemma2" else None
        return Layer(heads, b_o, norm, "pre", branch)
    if kind == "opt":
        block = model.decoder.layers[index]
        n = config.num_attention_heads
        d = config.hidden_size // n
        heads, b_o = _linear_layer(block.self_attn.v_proj, block.self_attn.out_proj, n, d)
        where = "pre" if config.do_layer_norm_before else "post"
        return Layer(heads, b_o, _layer_norm(block.self_attn_layer_norm), where)
    if kind == "gptj":
        block = model.h[index]
        n = config.n_head
        heads, b_o = _linear_layer(block.attn.v_proj, block.attn.out_proj, n, config.n_embd // n)
        return Layer(heads, b_o, _layer_norm(block.ln_1), "pre")
    if kind == "falcon":
        block = model.h[index]
        n = config.num_attention_heads
        d = config.hidden_size // n
        fused = block.self_attention.query_key_value
        if config.new_decoder_architecture:  # per kv group g: [q x (n/kv) | k | v]
            per = n // config.num_kv_heads
            rows = lambda h: _span((h // per) * (per + 2) * d + (per + 1) * d, d)  # noqa: E731
        elif config.multi_query:  # [q (n d) | k (d) | v (d)]
            rows = lambda h: _span((n + 1) * d, d)  # noqa: E731
        else:  # per head [q_h | k_h | v_h]
            rows = lambda h: _span(h * 3 * d + 2 * d, d)  # noqa: E731
        heads, b_o = _per_head(lambda h: (fused, rows(h)), block.self_attention.dense, n, d)
        two = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
        norm = block.ln_attn if two else block.input_layernorm
        return Layer(heads, b_o, _layer_norm(norm), "pre")
    if kind == "gpt_neox":
        block = model.layers[index]
        n = config.num_attention_heads
        d = config.hidden_size // n
        fused = block.attention.query_key_value  # per head [q_h | k_h | v_h]
        heads, b_o = _per_head(
            lambda h: (fused, _span(h * 3 * d + 2 * d, d)), block.attention.dense, n, d
        )
        return Layer(heads, b_o, _layer_norm(block.input_layernorm), "pre")
    if kind == "modernbert":
        block = model.layers[index]
        n = config.num_attention_heads
        d = config.hidden_size // n
        fused = block.attn.Wqkv  # [q (n d) | k (n d) | v (n d)]
        heads, b_o = _per_head(lambda h: (fused, _span(2 * n * d + h * d, d)), block.attn.Wo, n, d)
        ln = block.attn_norm
        norm = Norm("none") if isinstance(ln, torch.nn.Identity) else _layer_norm(ln)
        return Layer(heads, b_o, norm, "pre")
    if kind == "t5":
        sa = model.encoder.block[index].layer[0]
        heads, b_o = _linear_layer(
            sa.SelfAttention.v, sa.SelfAttention.o, config.num_heads, config.d_kv
        )
        return Layer(heads, b_o, _rms(sa.layer_norm), "pre")
    if kind == "vit":
        block = model.layers[index]
        n = config.num_attention_heads
        d = config.hidden_size // n
        heads, b_o = _linear_layer(block.attention.v_proj, block.attention.o_proj, n, d)
        return Layer(heads, b_o, _layer_norm(block.layernorm_before), "pre")
    raise ValueError(f"unsupported model {type(model).__name__} ({kind})")


def final_norm(model) -> Norm | None:
    """The norm after the last layer that belongs to the output, if the family has one."""
    config = model.config
    kind = config.model_type
    module = {
        "gpt2": lambda: model.ln_f,
        "gptj": lambda: model.ln_f,
        "falcon": lambda: model.ln_f,
        "gpt_neox": lambda: model.final_layer_norm,
        "opt": lambda: model.decoder.final_layer_norm,  # None for post-LN (350m)
        "modernbert": lambda: model.final_norm,
        "vit": lambda: model.layernorm,
        "t5": lambda: model.encoder.final_layer_norm,
    }.get(kind)
    if kind in ("gemma", "gemma2"):
        return _rms(model.norm, plus_one=True)
    if kind in _LLAMA_KINDS or _llama_shaped(model):
        if isinstance(model.norm, torch.nn.LayerNorm):  # Starcoder2
            return _layer_norm(model.norm)
        return _rms(model.norm)
    if kind in ("gemma", "gemma2"):
        return _rms(model.norm, plus_one=True)
    if module is None or module() is None:
        return None
    return _rms(module()) if kind == "t5" else _layer_norm(module())


def _scale(norm: Norm, norm_input: torch.Tensor) -> torch.Tensor:
    """Per-token 1/sigma (layer) or 1/rms (rms) of the norm's real input, as a column."""
    u = _d(norm_input)
    if norm.kind == "rms":
        return 1.0 / torch.sqrt((u * u).mean(-1, keepdim=True) + norm.eps)
    centred = u - u.mean(-1, keepdim=True)
    return 1.0 / torch.sqrt((centred * centred).mean(-1, keepdim=True) + norm.eps)


def _frozen(norm: Norm, z: torch.Tensor, norm_input, shift: bool) -> torch.Tensor:
    """The norm of z with its per-token scale taken from ``norm_input``; beta when ``shift``."""
    if norm.kind == "none":
        return z
    s = _scale(norm, norm_input)
    if norm.kind == "rms":
        return z * s * norm.gamma
    y = (z - z.mean(-1, keepdim=True)) * s * norm.gamma
    return y + norm.beta if shift else y


class FrozenReference:
    """The frozen SAN+skip network of ``model`` for one batch, written branch by branch."""

    def __init__(self, model, x0, attn, norm_inputs, final_input=None, branch_inputs=None):
        self.model = model
        self.x0 = _d(x0)
        self.attn = [_d(a) for a in attn]
        self.norm_inputs = norm_inputs
        self.branch_inputs = branch_inputs or [None] * len(attn)
        self.layers = [layer_params(model, i) for i in range(len(attn))]
        self.final = None
        norm = final_norm(model)
        if norm is not None:
            self.final = (norm, final_input)

    def step(self, index: int, x, choice, biases: bool):
        """One layer on x: ``choice`` is None (skip), a head index, or "all" (the whole layer)."""
        layer = self.layers[index]
        A, z_in = self.attn[index], self.norm_inputs[index]

        def head(h, inp):
            w_v, b_v, w_o = layer.heads[h]
            v = inp @ w_v + (b_v if biases else 0)  # (batch, token, d)
            return (A[:, h] @ v) @ w_o

        def norm(z):
            return _frozen(layer.norm, z, z_in, biases)

        def branch(z):  # Gemma2's norm on the attention output: RMS, no shift
            if layer.branch is None:
                return z
            return _frozen(layer.branch, z, self.branch_inputs[index], biases)

        b_o = layer.b_o if biases else 0
        if layer.where == "post":
            if choice is None:
                return norm(x)
            if choice == "all":
                return norm(x + sum(head(h, x) for h in range(len(layer.heads))) + b_o)
            return norm(head(choice, x))
        if choice is None:
            return x
        inner = norm(x)
        if choice == "all":
            return x + branch(sum(head(h, inner) for h in range(len(layer.heads))) + b_o)
        return branch(head(choice, inner))

    def finish(self, y, biases: bool):
        if self.final is None:
            return y
        norm, final_input = self.final
        return _frozen(norm, y, final_input, biases)

    def path(self, path):
        """Contribution of one path (a tuple: None = skip, else a head index per layer)."""
        x = self.x0
        for index, choice in enumerate(path):
            x = self.step(index, x, choice, biases=False)
        return self.finish(x, biases=False)

    def constant(self):
        """The frozen network on zero embeddings: every bias and shift, propagated."""
        x = torch.zeros_like(self.x0)
        for index in range(len(self.layers)):
            x = self.step(index, x, "all", biases=True)
        return self.finish(x, biases=True)

    def outputs(self):
        """The frozen network on X_0, layer by layer: [X_0, X_1, ..., X_L]."""
        xs = [self.x0]
        for index in range(len(self.layers)):
            xs.append(self.step(index, xs[-1], "all", biases=True))
        return xs

    def output(self):
        """The frozen network's output (after the final norm, where the family has one)."""
        return self.finish(self.outputs()[-1], biases=True)

    def by_length(self):
        """Sum of the contributions of all paths of each length 0..L (enumerating (H+1)^L paths)."""
        L = len(self.layers)
        n_heads = len(self.layers[0].heads)
        sums = [torch.zeros_like(self.finish(self.x0, False)) for _ in range(L + 1)]
        count = 0
        for path in itertools.product([None, *range(n_heads)], repeat=L):
            sums[sum(c is not None for c in path)] += self.path(path)
            count += 1
        assert count == (n_heads + 1) ** L
        return sums


# --- the reads, from a SAN+skip run of the reference's own ------------------------

#: model_type -> (layer list, attention module, index of its probabilities in the
#: module's output, the frozen norm (None: config-dependent), Gemma2's branch norm).
_SITES = {
    "bert": ("encoder.layer", "attention.self", 1, "attention.output.LayerNorm", None),
    "roberta": ("encoder.layer", "attention.self", 1, "attention.output.LayerNorm", None),
    "electra": ("encoder.layer", "attention.self", 1, "attention.output.LayerNorm", None),
    "deberta-v2": ("encoder.layer", "attention.self", 1, "attention.output.LayerNorm", None),
    "distilbert": ("transformer.layer", "attention", 1, "sa_layer_norm", None),
    "gpt2": ("h", "attn", 1, "ln_1", None),
    "llama": ("layers", "self_attn", 1, "input_layernorm", None),
    "mistral": ("layers", "self_attn", 1, "input_layernorm", None),
    "qwen2": ("layers", "self_attn", 1, "input_layernorm", None),
    "qwen3": ("layers", "self_attn", 1, "input_layernorm", None),
    "gemma": ("layers", "self_attn", 1, "input_layernorm", None),
    "phi3": ("layers", "self_attn", 1, "input_layernorm", None),
    "gemma2": ("layers", "self_attn", 1, "input_layernorm", "post_attention_layernorm"),
    "opt": ("decoder.layers", "self_attn", 1, "self_attn_layer_norm", None),
    "gptj": ("h", "attn", 1, "ln_1", None),
    "falcon": ("h", "self_attention", 1, None, None),
    "gpt_neox": ("layers", "attention", 1, "input_layernorm", None),
    "modernbert": ("layers", "attn", 1, "attn_norm", None),
    "t5": ("encoder.block", "layer.0.SelfAttention", 2, "layer.0.layer_norm", None),
    "vit": ("layers", "attention", 1, "layernorm_before", None),
}


_DECODERS = {
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "opt", "gptj",
    "falcon", "gpt_neox",
}  # fmt: skip


#: The Llama-shaped decoders this reference names; any other model whose layers have
#: Llama's submodules (Mixtral, Starcoder2, ...) is read the same way.
_LLAMA_KINDS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")
_LLAMA_SHAPE = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")


def _llama_shaped(model) -> bool:
    layers = getattr(model, "layers", None)
    return layers is not None and all(hasattr(layers[0], name) for name in _LLAMA_SHAPE)


def _module(root, path: str):
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def _surgery(work) -> None:
    """Replace each layer's forward on the copy by its SAN+skip re-implementation."""
    from tests.reference import layers as layer_reference
    from tests.reference import surgery as gpt2_bert_reference

    kind = work.config.model_type
    if kind in ("bert", "gpt2"):
        gpt2_bert_reference._SURGERY[kind](work, attn_skip=True, mlp=False)
        return
    path, forward = layer_reference.layer_implementation(work)
    for layer in _module(work, path):
        layer.forward = partial(forward, layer, skip=True, mlp=False)


def reference_reads(model, inputs: dict, attn_implementation: str | None = None) -> dict:
    """X_0..X_L of the SAN+skip variant, per layer the attention probabilities and the
    inputs of the norms to freeze, and the model's output, by module surgery on a copy
    with plain torch hooks.

    ``inputs``: the keyword arguments of the model's forward; ``attn_implementation``
    the attention the copy runs (``reference_eager`` where probe keeps the softmax in
    float64).  ``model`` is left as it was.
    """
    from tests.reference.surgery import _strip_overrides

    config = model.config
    kind = config.model_type
    default = _SITES["llama"] if _llama_shaped(model) else None
    layers_path, attn_path, index, norm_path, branch_path = _SITES.get(kind, default)
    if norm_path is None:  # Falcon: ln_attn where the new architecture has two norms
        two = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
        norm_path = "ln_attn" if two else "input_layernorm"
    work = copy.deepcopy(model)
    _strip_overrides(work)
    if attn_implementation is not None:
        work.config._attn_implementation = attn_implementation
    work.eval()
    _surgery(work)
    reads: dict[str, list] = {"xs": [], "attn": [], "norm": [], "branch": []}

    def first_input(store, module, args, kwargs):
        store.append((args[0] if args else kwargs["hidden_states"]).detach())

    layers = list(_module(work, layers_path))
    layers[0].register_forward_pre_hook(
        lambda m, a, k: None if reads["xs"] else first_input(reads["xs"], m, a, k),
        with_kwargs=True,
    )
    for layer in layers:
        layer.register_forward_hook(
            lambda m, a, out: reads["xs"].append(
                (out[0] if isinstance(out, tuple) else out).detach()
            )
        )
        _module(layer, attn_path).register_forward_hook(
            lambda m, a, out: reads["attn"].append(out[index].detach())
        )
        _module(layer, norm_path).register_forward_pre_hook(
            partial(first_input, reads["norm"]), with_kwargs=True
        )
        if branch_path is not None:
            _module(layer, branch_path).register_forward_pre_hook(
                partial(first_input, reads["branch"]), with_kwargs=True
            )
    extra = {}
    if kind in _DECODERS or _llama_shaped(model):  # a one-shot forward: no key/value cache
        extra = {"use_cache": False}
    if kind == "deberta-v2":  # its attention returns the probabilities only when asked
        extra = {"output_attentions": True}
    with torch.no_grad():
        out = work(**inputs, **extra)
    L = len(layers)
    assert len(reads["xs"]) == L + 1 and len(reads["attn"]) == len(reads["norm"]) == L, {
        k: len(v) for k, v in reads.items()
    }
    return {
        "x0": reads["xs"][0],
        "xs": reads["xs"],
        "attn": reads["attn"],
        "norm_inputs": reads["norm"],
        "branch_inputs": reads["branch"] or None,
        "final_input": reads["xs"][-1],
        # The model's own output of X_L: after its final norm, where it has one.
        "output": (out[0] if isinstance(out, tuple) else out.last_hidden_state).detach(),
    }
