"""Tiny random base models for the reference oracle (no ``probe``/``nnsight`` imports).

``tiny_model(family, seed)`` builds one of the four base models the project studies
(``BertModel``, ``AlbertModel``, ``XLNetModel``, ``GPT2Model``) at toy size, in eval
mode with ``attn_implementation="eager"`` and the configs' default dropout
probabilities (inactive in eval mode).

Construction is deterministic from ``seed``: the global torch RNG is seeded
(inside ``torch.random.fork_rng``, so the caller's RNG state is left as it was)
before the model is built.  After HuggingFace's own initialisation every floating
parameter is redrawn from the same seeded RNG: LayerNorm gains ~ 1 + 0.2 N(0, 1),
everything else (weights, biases, LayerNorm shifts, embeddings, XLNet's relative
attention biases and segment embeddings) ~ 0.15 N(0, 1).  HF's default init
(std 0.02, zero biases, unit gains) makes attention almost uniform and every bias
zero, which would let bias- or norm-placement mistakes pass unnoticed.
"""

from __future__ import annotations

import torch
from transformers import (
    AlbertConfig,
    AlbertModel,
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2Model,
    PretrainedConfig,
    XLNetConfig,
    XLNetModel,
)

FAMILIES = ("bert", "albert", "xlnet", "gpt2")

VOCAB_SIZE = 80
HIDDEN = 32
HEADS = 4
MAX_POSITIONS = 64


def tiny_config(family: str) -> PretrainedConfig:
    """The config of ``tiny_model(family)`` (eager attention, default dropout)."""
    if family == "bert":
        return BertConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            intermediate_size=64,
            max_position_embeddings=MAX_POSITIONS,
            attn_implementation="eager",
        )
    if family == "albert":
        # As albert-base-v2: one layer group holding one layer, applied
        # num_hidden_layers times; embedding_size != hidden_size, so the encoder's
        # embedding_hidden_mapping_in is a real projection.
        return AlbertConfig(
            vocab_size=VOCAB_SIZE,
            embedding_size=16,
            hidden_size=HIDDEN,
            num_hidden_layers=3,
            num_hidden_groups=1,
            inner_group_num=1,
            num_attention_heads=HEADS,
            intermediate_size=64,
            max_position_embeddings=MAX_POSITIONS,
            attn_implementation="eager",
        )
    if family == "xlnet":
        return XLNetConfig(
            vocab_size=VOCAB_SIZE,
            d_model=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            d_head=HIDDEN // HEADS,
            d_inner=64,
            mem_len=None,
            attn_implementation="eager",
        )
    if family == "gpt2":
        return GPT2Config(
            vocab_size=VOCAB_SIZE,
            n_positions=MAX_POSITIONS,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            bos_token_id=VOCAB_SIZE - 1,
            eos_token_id=VOCAB_SIZE - 1,
            attn_implementation="eager",
        )
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


_MODEL_CLASSES = {
    "bert": BertModel,
    "albert": AlbertModel,
    "xlnet": XLNetModel,
    "gpt2": GPT2Model,
}

_DECODER = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=HIDDEN,
    num_hidden_layers=3,
    num_attention_heads=HEADS,
    num_key_value_heads=2,  # grouped-query attention: 2 query heads per key/value head
    intermediate_size=48,
    max_position_embeddings=MAX_POSITIONS,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
#: GPT-2's block (GPT-BigCode's too).
_GPT2 = dict(
    vocab_size=VOCAB_SIZE,
    n_positions=MAX_POSITIONS,
    n_embd=HIDDEN,
    n_layer=2,
    n_head=HEADS,
    bos_token_id=1,
    eos_token_id=2,
)
#: A decoder with sliding and full layers, the window shorter than the tests' sequences.
_SLIDING = {
    **_DECODER,
    "head_dim": 8,
    "sliding_window": 3,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
}
_ENCODER = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=HEADS,
    intermediate_size=48,
    max_position_embeddings=MAX_POSITIONS,
    pad_token_id=0,
)

#: family -> (transformers config class, its keyword arguments): the tiny model of every
#: family the generic walker runs.  A new family is one entry here (and one in
#: probe/models/families.py); the tests find it in both registries.
TINY_CONFIGS: dict[str, tuple[str, dict]] = {
    "bert": ("BertConfig", _ENCODER),
    "roberta": ("RobertaConfig", {**_ENCODER, "max_position_embeddings": MAX_POSITIONS + 2}),
    "electra": ("ElectraConfig", {**_ENCODER, "embedding_size": 16}),
    "deberta-v2": (
        "DebertaV2Config",
        {
            **_ENCODER,
            "relative_attention": True,
            "position_buckets": 8,
            "max_relative_positions": 16,
            "pos_att_type": ["p2c", "c2p"],
            "norm_rel_ebd": "layer_norm",
            "position_biased_input": False,
        },
    ),
    "distilbert": (
        "DistilBertConfig",
        dict(
            vocab_size=VOCAB_SIZE,
            dim=HIDDEN,
            n_layers=2,
            n_heads=HEADS,
            hidden_dim=48,
            max_position_embeddings=MAX_POSITIONS,
            pad_token_id=0,
        ),
    ),
    "gpt2": ("GPT2Config", _GPT2),
    "llama": ("LlamaConfig", _DECODER),
    "mistral": ("MistralConfig", {**_DECODER, "sliding_window": 5}),
    "qwen2": ("Qwen2Config", _DECODER),
    "qwen3": ("Qwen3Config", {**_DECODER, "head_dim": 8}),
    "gemma": ("GemmaConfig", {**_DECODER, "head_dim": 8, "num_key_value_heads": 1}),
    "gemma2": (
        "Gemma2Config",
        {
            **_DECODER,
            "head_dim": 8,
            "sliding_window": 5,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 8,
        },
    ),
    "phi3": ("Phi3Config", _DECODER),
    # Gemma 3: sliding and global layers (a window shorter than the tests' sequences), the
    # scores' scale, both soft caps away from their neutral values, q/k (1 + w) RMS norms.
    "gemma3": (
        "Gemma3TextConfig",
        {
            **_SLIDING,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 6,
        },
    ),
    # Phi: parallel attention and MLP, rotary on a quarter of each head, every projection
    # with a bias; the LM head (with a bias of its own) is not tied, as in Phi-1/1.5/2.
    "phi": (
        "PhiConfig",
        {
            **_DECODER,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
            },
            "qk_layernorm": False,
        },
    ),
    # GPT-BigCode, multi-query (one key/value head in the fused c_attn).
    "gpt-bigcode": (
        "GPTBigCodeConfig",
        {**_GPT2, "n_inner": 48, "multi_query": True},
    ),
    "starcoder2": ("Starcoder2Config", {**_DECODER, "use_bias": True}),
    # GPT-OSS: learned sink logits, sliding and full layers (a window shorter than the tests'
    # sequences), biased projections, a mixture of four experts with two per token.
    "gpt-oss": (
        "GptOssConfig",
        {
            **_SLIDING,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "tie_word_embeddings": True,
            # YaRN's factor as the ratio of the context lengths, as transformers checks it.
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "original_max_position_embeddings": 2,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
            },
        },
    ),
    "mixtral": ("MixtralConfig", {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "olmo2": ("Olmo2Config", _DECODER),
    # Sequential StableLM: per-head q/k LayerNorms (StableLmLayerNormPerHead,
    # nn.LayerNorm children), q/k/v biases, rotary on the default quarter of each head.
    "stablelm": (
        "StableLmConfig",
        {
            **_DECODER,
            "qk_layernorm": True,
            "use_qkv_bias": True,
            "use_parallel_residual": False,
            "tie_word_embeddings": True,
        },
    ),
    # logit_scale multiplies CohereForCausalLM's logits only; away from 1 so a head that
    # forgets it shows.
    "cohere": (
        "CohereConfig",
        {**_DECODER, "logit_scale": 0.25, "use_qk_norm": False, "tie_word_embeddings": True},
    ),
    # Every multiplier away from 1 and from the others, so a misplaced one shows:
    # attention_multiplier replaces 1/sqrt(head_dim) as the scores' scale.
    "granite": (
        "GraniteConfig",
        {
            **_DECODER,
            "embedding_multiplier": 2.0,
            "attention_multiplier": 0.3,
            "residual_multiplier": 0.5,
            "logits_scaling": 4.0,
            "tie_word_embeddings": True,
        },
    ),
    "bloom": (
        "BloomConfig",
        dict(
            vocab_size=VOCAB_SIZE,
            hidden_size=HIDDEN,
            n_layer=3,
            n_head=HEADS,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
    ),
    "opt": (
        "OPTConfig",
        dict(
            vocab_size=VOCAB_SIZE,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            ffn_dim=48,
            word_embed_proj_dim=HIDDEN,
            max_position_embeddings=MAX_POSITIONS,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "gptj": (
        "GPTJConfig",
        dict(
            vocab_size=VOCAB_SIZE,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            rotary_dim=4,
            n_positions=MAX_POSITIONS,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "falcon": (
        "FalconConfig",
        dict(
            vocab_size=VOCAB_SIZE,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            multi_query=True,
            parallel_attn=True,
            new_decoder_architecture=False,
            bias=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "gpt-neox": ("GPTNeoXConfig", {**_DECODER, "num_key_value_heads": None, "rotary_pct": 0.25}),
    "modernbert": (
        "ModernBertConfig",
        {
            **_ENCODER,
            "num_hidden_layers": 3,
            "global_attn_every_n_layers": 2,
            "local_attention": 4,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "cls_token_id": 1,
            "sep_token_id": 2,
        },
    ),
    "t5": (
        "T5Config",
        dict(
            vocab_size=VOCAB_SIZE,
            d_model=HIDDEN,
            d_kv=8,
            d_ff=48,
            num_layers=2,
            num_heads=HEADS,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        ),
    ),
    "vit": (
        "ViTConfig",
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            intermediate_size=48,
            image_size=16,
            patch_size=4,
            num_channels=3,
        ),
    ),
}
#: The branches a family's code takes on its config, each a tiny model of its own:
#: name -> (family, config changes).
TINY_VARIANTS: dict[str, tuple[str, dict]] = {
    "opt-post-ln": ("opt", {"do_layer_norm_before": False, "word_embed_proj_dim": 16}),
    "gpt-neox-sequential": ("gpt-neox", {"use_parallel_residual": False}),
    "falcon-sequential": ("falcon", {"parallel_attn": False, "multi_query": False}),
    "falcon-new-architecture": (
        "falcon",
        {"new_decoder_architecture": True, "num_kv_heads": 2, "multi_query": False},
    ),
    "falcon-alibi": ("falcon", {"alibi": True, "multi_query": False}),
    # GPT-NeoX's parallel layout: one norm feeds both branches, and the layer has no
    # post-attention norm (post_attention_layernorm is None).
    "stablelm-parallel": ("stablelm", {"use_parallel_residual": True, "qk_layernorm": False}),
    # q/k CohereLayerNorms with a weight per head, normalising over each head's dimension.
    "cohere-qk-norm": ("cohere", {"use_qk_norm": True}),
    # Phi's per-model query/key LayerNorms.
    "phi-qk-layernorm": ("phi", {"qk_layernorm": True}),
    # GPT-BigCode's multi-head layout: c_attn's rows [q_h | k_h | v_h] per head.
    "gpt-bigcode-multi-head": ("gpt-bigcode", {"multi_query": False}),
}
#: Families whose base model is not AutoModel's choice for their config.
_SPEC_CLASSES = {"t5": "T5EncoderModel"}


def tiny_spec_config(family: str):
    import transformers

    family, changes = TINY_VARIANTS.get(family, (family, {}))
    name, kwargs = TINY_CONFIGS[family]
    kwargs = {k: v for k, v in {**kwargs, **changes}.items() if v is not None}
    return getattr(transformers, name)(**kwargs)


def tiny_spec_model(
    family: str, seed: int = 0, dtype: torch.dtype = torch.float64, attn: str = "eager"
) -> torch.nn.Module:
    """A tiny random model of a walker family in eval mode, redrawn as ``_randomize_`` does."""
    import transformers

    config = tiny_spec_config(family)
    config._attn_implementation = attn
    cls = getattr(
        transformers, _SPEC_CLASSES.get(TINY_VARIANTS.get(family, (family,))[0], "AutoModel")
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (
            transformers.AutoModel.from_config(config, attn_implementation=attn)
            if cls is transformers.AutoModel
            else cls._from_config(config, attn_implementation=attn)
        )
        _randomize_(model)
    if dtype == torch.float64 and getattr(config, "_experts_implementation", None) is not None:
        model.config._experts_implementation = "eager"  # grouped-matmul experts take no float64
    return model.to(dtype).eval()


def _randomize_(model: torch.nn.Module) -> None:
    """Redraw every floating parameter from the (already seeded) global RNG."""
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if not param.is_floating_point():
                    continue
                if name == "weight" and (
                    isinstance(module, torch.nn.LayerNorm) or "Norm" in type(module).__name__
                ):
                    param.copy_(1.0 + 0.2 * torch.randn_like(param))
                else:
                    param.copy_(0.15 * torch.randn_like(param))


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """A tiny random ``family`` base model in eval mode, deterministic from ``seed``."""
    config = tiny_config(family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _MODEL_CLASSES[family](config)
        _randomize_(model)
    if dtype == torch.float64 and getattr(config, "_experts_implementation", None) is not None:
        model.config._experts_implementation = "eager"  # grouped-matmul experts take no float64
    return model.to(dtype).eval()
