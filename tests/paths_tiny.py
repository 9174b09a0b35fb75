"""Tiny models for the path tests.

``tiny_paths_model``: the original post-LN families at L=3 layers, H=2 heads, so
(H+1)^L = 27 paths.  ``path_model(name)``: any family in probe's registry (its tiny
config from ``tests/reference/tiny.py``), any config branch in ``TINY_VARIANTS``, and
the few configurations only the path analyses care about (``PATH_VARIANTS``).
"""

from __future__ import annotations

import pytest
import torch

from tests.reference.tiny import (
    _MODEL_CLASSES,
    HIDDEN,
    TINY_CONFIGS,
    TINY_VARIANTS,
    _randomize_,
    tiny_config,
    tiny_spec_config,
    tiny_spec_model,
)

#: name -> (family, config changes): what the decomposition must get right beyond the
#: families' own tiny configs.  Llama with biases on its attention projections (the
#: constant is then not zero in an RMS family) and an LM head tied to its embeddings.
PATH_VARIANTS: dict[str, tuple[str, dict]] = {
    "llama-bias-tied": ("llama", {"attention_bias": True, "tie_word_embeddings": True}),
}


def tiny_paths_model(family: str, layers: int = 3, heads: int = 2, seed: int = 0):
    """A float64 eval-mode model of ``family`` with ``layers`` x ``heads``, weights as tiny_model."""
    config = tiny_config(family)
    config.num_hidden_layers = layers  # attribute_map: n_layer for XLNet and GPT-2
    config.num_attention_heads = heads
    if family == "xlnet":
        config.d_head = HIDDEN // heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _MODEL_CLASSES[family](config)
        _randomize_(model)
    return model.to(torch.float64).eval()


def path_model(name: str, seed: int = 0, dtype: torch.dtype = torch.float64):
    """A tiny eval-mode model of a registry family or a variant, with HF's eager attention."""
    if name in ("albert", "xlnet"):
        return tiny_paths_model(name, seed=seed).to(dtype)
    if name == "fastformer":
        from tests.fastformer_tiny import tiny_fastformer

        return tiny_fastformer(seed=seed, dtype=dtype)
    if name in TINY_CONFIGS or name in TINY_VARIANTS:
        return tiny_spec_model(name, seed=seed, dtype=dtype)
    import transformers

    family, changes = PATH_VARIANTS[name]
    config = tiny_spec_config(family)
    for key, value in changes.items():
        setattr(config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModel.from_config(config, attn_implementation="eager")
        _randomize_(model)
    return model.to(dtype).eval()


def model_inputs(model, batch: int = 2, tokens: int = 7, seed: int = 0) -> dict:
    """Keyword arguments of one forward: seeded token ids (no padding), or seeded pixels."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    if config.model_type == "vit":
        size = config.image_size
        pixels = torch.randn(batch, config.num_channels, size, size, generator=generator)
        return {"pixel_values": pixels.to(next(model.parameters()).dtype)}
    vocab = config.vocab_size
    ids = torch.randint(3, vocab, (batch, tokens), generator=generator)  # past pad, bos, eos
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def ids(batch: int = 2, tokens: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 80, (batch, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors gain nothing from torch's thread pool; on a busy machine it costs 10x.
    Autouse in every test module that imports it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def padded_inputs(model):
    """(forward keywords, ids or pixels, attention mask) of 3 seeded sequences of 7 tokens,
    the last two right-padded as probe's batches are (images: no padding)."""
    inputs = model_inputs(model, batch=3, tokens=7)
    if "pixel_values" in inputs:
        config = model.config
        tokens = (config.image_size // config.patch_size) ** 2 + 1
        return inputs, inputs["pixel_values"], torch.ones(3, tokens, dtype=torch.long)
    mask = inputs["attention_mask"]
    mask[1, 5:] = 0  # right padding, as probe's batches have it
    mask[2, 4:] = 0
    return inputs, inputs["input_ids"], mask
