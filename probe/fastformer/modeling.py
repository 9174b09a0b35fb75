"""Fastformer causal LM (additive attention made causal), as a HuggingFace model.

The module tree and parameter names are those of the checkpoints users already
have (``shared/fastformer-checkpoint.md``), so their ``pytorch_model.bin`` folders
load unchanged.  One layer, input x (eval mode)::

    x = x + conv(conv_norm(x))                   # only with config.convolve
    h = attn_norm(x); q, k, v = Wquery h, Wkeys h, Wvalues h
    pq = attn_proj(pool(q, query_attn))
    r = skip(h) + pq * k                          # the residual is the *normalised* h
    pk = pool(mid_norm(r), key_attn)
    x = mid_skip(r) + pk * v
    x = x + unboom(gelu(boom(boom_norm(x))))

``pool`` is the causal additive pooling of :mod:`probe.fastformer.pooling`.
``skip`` and ``mid_skip`` are identities with no parameters: they name the two
residual terms so hooks can reach the additions themselves (probe's ablations).
Output: ``logits = proj_logits(x_L) / sqrt(d)``, no final LayerNorm.

Generation keeps, per layer, the two pooling states and the last
``kernel_size - 1`` convolution inputs (:class:`FastformerCache`): one new token
costs O(d^2), whatever the prefix length.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import CausalLMOutputWithPast

from .config import FastformerConfig
from .pooling import causal_pool

#: The output field that carries the generation state: ``cache`` from transformers 5.24,
#: ``past_key_values`` before it (``generate`` reads it back under that name).
_CACHE_FIELD = (
    "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
)


class CausalPooling(nn.Module):
    """g_i = causal softmax-weighted average of x_j, j <= i (no parameters: w is the caller's)."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, x, w, attention_mask=None, state=None):
        return causal_pool(x, w, self.n_heads, attention_mask, state)


class CausalConvolution(nn.Module):
    """x -> conv(conv_norm(x)), a grouped Conv1d left-padded with kernel_size - 1 zeros."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        d = config.hidden_size
        self.kernel_size = config.kernel_size
        self.conv_norm = nn.LayerNorm(d)
        self.convolutional_layer = nn.Conv1d(
            d, d, config.kernel_size, groups=config.groups, bias=False
        )

    def forward(self, x, past: torch.Tensor | None = None):
        """Returns conv(conv_norm(x)) (batch, token, hidden) and the last k-1 normalised inputs."""
        normed = self.conv_norm(x).transpose(1, 2)  # (batch, hidden, token)
        if past is None:
            past = normed.new_zeros(normed.shape[0], normed.shape[1], self.kernel_size - 1)
        padded = torch.cat([past, normed], dim=2)  # (batch, hidden, k-1+token)
        out = self.convolutional_layer(padded).transpose(1, 2)  # (batch, token, hidden)
        return out, padded[:, :, padded.shape[2] - (self.kernel_size - 1) :]


class AdditiveAttention(nn.Module):
    """The attention block, which carries its own two residuals."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        d = config.hidden_size
        self.Wquery = nn.Linear(d, d, bias=False)
        self.Wkeys = nn.Linear(d, d, bias=False)
        self.Wvalues = nn.Linear(d, d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.query_attn = nn.Parameter(torch.zeros(d))
        self.key_attn = nn.Parameter(torch.zeros(d))
        self.attn_norm = nn.LayerNorm(d)
        self.mid_norm = nn.LayerNorm(d)
        self.query_pool = CausalPooling(config.n_heads)
        self.key_pool = CausalPooling(config.n_heads)
        self.skip = nn.Identity()  # the `h +` term
        self.mid_skip = nn.Identity()  # the `r +` term
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x, attention_mask=None, state=None):
        h = self.attn_norm(x)
        q, k, v = self.Wquery(h), self.Wkeys(h), self.Wvalues(h)
        pooled_q, query_state = self.query_pool(q, self.query_attn, attention_mask, _get(state, 0))
        pq = self.attn_proj(pooled_q)
        r = self.skip(h) + self.dropout(pq * k)
        pk, key_state = self.key_pool(
            self.mid_norm(r), self.key_attn, attention_mask, _get(state, 1)
        )
        out = self.mid_skip(r) + self.dropout(pk * v)
        return out, (query_state, key_state)


def _get(state, i):
    return None if state is None else state[i]


class FastformerLayer(nn.Module):
    def __init__(self, config: FastformerConfig):
        super().__init__()
        d = config.hidden_size
        self.convolve = config.convolve
        if config.convolve:
            self.convolutional_layer = CausalConvolution(config)
        self.attention = AdditiveAttention(config)
        self.boom_norm = nn.LayerNorm(d)
        self.boom = nn.Linear(d, 4 * d, bias=False)
        self.activation = nn.GELU()
        self.unboom = nn.Linear(4 * d, d, bias=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x, attention_mask=None, layer_cache=None):
        """(batch, token, hidden) -> same; ``layer_cache`` (a dict) is read and updated in place."""
        if self.convolve:
            conv, window = self.convolutional_layer(x, _entry(layer_cache, "conv"))
            x = x + self.dropout(conv)
            _put(layer_cache, "conv", window)
        x, pools = self.attention(x, attention_mask, _entry(layer_cache, "pools"))
        _put(layer_cache, "pools", pools)
        return x + self.dropout(self.unboom(self.activation(self.boom(self.boom_norm(x)))))


def _entry(cache, key):
    return None if cache is None else cache.get(key)


def _put(cache, key, value):
    if cache is not None:
        cache[key] = value


class FastformerDecoder(nn.Module):
    """Position embeddings, the embedding LayerNorm and the stack of layers."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        d = config.hidden_size
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.LayerNorm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.decoders = nn.ModuleList(
            [FastformerLayer(config) for _ in range(config.num_hidden_layers)]
        )


class FastformerCache:
    """Per-layer generation state: the pooling states and the convolution window.

    Not a transformers ``Cache`` (there are no keys and values to store):
    ``generate`` passes it back to the model unchanged, and the model updates it.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, n_layers: int):
        self.layers: list[dict] = [{} for _ in range(n_layers)]
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    @property
    def is_linear(self) -> list[bool]:
        """No layer is a fixed-size state in transformers' sense: ``generate`` (5.24 on)
        passes only the tokens the cache has not seen."""
        return [False] * len(self.layers)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        for layer in self.layers:
            if "conv" in layer:
                layer["conv"] = layer["conv"][beam_idx]
            if "pools" in layer:
                layer["pools"] = tuple(p.select(beam_idx) for p in layer["pools"])


class FastformerPreTrainedModel(PreTrainedModel):
    config_class = FastformerConfig
    base_model_prefix = "fastformer_model"
    _no_split_modules = ["FastformerLayer"]
    _supports_sdpa = False
    _supports_flash_attn = False
    _is_stateful = True

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            # The word embedding, tied to the output: logits are divided by sqrt(d), which
            # assumes rows of norm ~sqrt(d) (torch's N(0, 1)); at std 0.02 the logits start
            # ~50x too small and a few hundred steps learn little beyond unigram counts.
            init.normal_(module.weight, mean=0.0, std=1.0)
            init.zeros_(module.weight[module.padding_idx])
        if isinstance(module, AdditiveAttention):
            init.normal_(module.query_attn, mean=0.0, std=self.config.initializer_range)
            init.normal_(module.key_attn, mean=0.0, std=self.config.initializer_range)


class FastformerForCausalLM(FastformerPreTrainedModel, GenerationMixin):
    """Token ids -> next-token logits, with the shared format's module names."""

    _tied_weights_keys = {"proj_logits.weight": "word_embedding.weight"}

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        config.validate_sizes()
        d = config.hidden_size
        self.word_embedding = nn.Embedding(config.vocab_size, d, padding_idx=0)
        self.fastformer_model = FastformerDecoder(config)
        self.proj_logits = nn.Linear(d, config.vocab_size)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the state is FastformerCache, created by the first forward

    def get_input_embeddings(self):
        return self.word_embedding

    def set_input_embeddings(self, value):
        self.word_embedding = value

    def get_output_embeddings(self):
        return self.proj_logits

    def set_output_embeddings(self, value):
        self.proj_logits = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: FastformerCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits (batch, token, vocab); ``attention_mask`` may span past + new tokens.

        The generation state comes in as ``cache`` (``generate`` from transformers 5.24)
        or ``past_key_values`` (before it), and goes out under the field the installed
        transformers reads (``_CACHE_FIELD``).  Beam search reorders it through
        ``FastformerCache.reorder_cache``, which ``generate`` calls itself."""
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        if input_ids is None:
            raise ValueError("FastformerForCausalLM needs input_ids")
        batch, tokens = input_ids.shape
        use_cache = self.config.use_cache if use_cache is None else use_cache
        use_cache = use_cache and not self.training
        if cache is None and use_cache:
            cache = FastformerCache(self.config.num_hidden_layers)
        start = 0 if cache is None else cache.seen
        if start + tokens > self.config.max_position_embeddings:
            raise ValueError(
                f"{start + tokens} tokens, but max_position_embeddings is "
                f"{self.config.max_position_embeddings}"
            )
        if attention_mask is not None:
            attention_mask = attention_mask[:, -tokens:]  # generate passes past + new

        decoder = self.fastformer_model
        positions = torch.arange(start, start + tokens, device=input_ids.device)
        x = self.word_embedding(input_ids) + decoder.position_embeddings(positions)[None]
        x = decoder.dropout(decoder.LayerNorm(x))
        states = [x] if output_hidden_states else None
        for i, layer in enumerate(decoder.decoders):
            x = layer(x, attention_mask, None if cache is None else cache.layers[i])
            if states is not None:
                states.append(x)
        if cache is not None:
            cache.seen = start + tokens
        logits = self.proj_logits(x) / math.sqrt(self.config.hidden_size)

        loss = None
        if labels is not None:
            smoothing = float(self.config.label_smoothing) if self.training else 0.0
            shifted = logits[:, :-1].reshape(-1, logits.shape[-1])  # (batch*(token-1), vocab)
            if shifted.dtype not in (torch.float32, torch.float64):
                shifted = shifted.float()  # half-precision logits: the loss in float32
            loss = nn.functional.cross_entropy(
                shifted,
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
                label_smoothing=smoothing,
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=None if states is None else tuple(states),
            **{_CACHE_FIELD: cache if use_cache else None},
        )
