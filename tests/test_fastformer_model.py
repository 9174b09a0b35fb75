"""The Fastformer causal LM against the O(T^2) reference: pooling, logits, loading, generation."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, AutoModelForCausalLM

import probe  # noqa: F401  (registers the family with the Auto classes)
from probe.fastformer import (
    FastformerConfig,
    FastformerForCausalLM,
    causal_pool,
    naive_causal_pool,
    pooling_weights,
)
from tests.fastformer_tiny import tiny_config, tiny_fastformer, write_shared_format
from tests.reference import fastformer as ref


def _data(tokens, dtype, seed=0, batch=2, d=32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, d, generator=gen, dtype=torch.float64).to(dtype)
    w = (scale * torch.randn(d, generator=gen, dtype=torch.float64)).to(dtype)
    return x, w


def _ones(x):
    return torch.ones(x.shape[:2], dtype=torch.long)


# Tolerances: float32 keeps ~7 digits; a weighted average of O(1) values computed in two
# orders differs by a few ulps (~1e-7), so 1e-6 is tight.  float64: ~1e-16 per operation,
# 1e-12 leaves room for the sums over 150 positions.
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_pooling_equals_explicit_causal_softmax(dtype, tol):
    x, w = _data(150, dtype)  # 150 > 2 blocks of 64: the carried sums are exercised
    got, _ = causal_pool(x, w, 4)
    want = ref.causal_average(x.double(), w.double(), 4, _ones(x))
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=0)


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(1, 140),
    heads=st.sampled_from([1, 2, 4, 8]),
    scale=st.floats(0.1, 20.0),
    block=st.integers(1, 70),
    seed=st.integers(0, 1000),
)
def test_pooling_equals_naive_cumsum_where_it_does_not_overflow(tokens, heads, scale, block, seed):
    x, w = _data(tokens, torch.float64, seed, scale=scale)
    got, _ = causal_pool(x, w, heads, block=block)
    naive = naive_causal_pool(x, w, heads)
    assert torch.isfinite(naive).all()  # scores stay below ~|20 * 6 * sqrt(8)| < 700
    # Naive and blocked differ in summation order; relative to the largest |x| (~4),
    # float64 leaves ~1e-13 after 140 terms.
    torch.testing.assert_close(got, naive, atol=1e-11, rtol=0)


def test_pooling_is_finite_and_correct_at_huge_scores_and_8192_tokens():
    tokens, d, heads = 8192, 16, 2
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, tokens, d, generator=gen, dtype=torch.float64)
    # Scores of +-1e4: the first coordinate of each head carries them (w picks it out).
    x[..., 0] = 1e4 * (2 * torch.rand(tokens, generator=gen, dtype=torch.float64) - 1)
    x[..., 8] = -x[..., 0].flip(-1)
    w = torch.zeros(d, dtype=torch.float64)
    w[0] = w[8] = 8**0.5  # score = x_0 (head 0), x_8 (head 1), exactly
    naive = naive_causal_pool(x, w, heads)
    assert not torch.isfinite(naive).all()  # exp(1e4) overflows in the naive form
    # Tolerances relative to the values (x holds entries of 1e4): a few ulps of the dtype.
    for dtype, rtol in ((torch.float64, 1e-14), (torch.float32, 5e-7)):
        xd, wd = x.to(dtype), w.to(dtype)
        got, _ = causal_pool(xd, wd, heads)
        assert torch.isfinite(got).all()
        rows = [0, 1, 2, 63, 64, 65, 1000, 4095, 4096, 8191]
        # The reference sees the same rounded inputs, in float64.
        want = ref.causal_average(xd.double(), wd.double(), heads, _ones(x), rows=rows)
        torch.testing.assert_close(got[:, rows].double(), want, atol=1e-6, rtol=rtol)
    # -1e4 everywhere but one token: 0/0 in the naive form, a clean average here.
    x2, w2 = _data(300, torch.float32)
    low = torch.full((1, 300), -1e4)
    low[0, 150] = 0
    pooled, _ = causal_pool(x2[:1], w2, 1, attention_mask=(low == 0).long())
    assert torch.isfinite(pooled).all()
    torch.testing.assert_close(pooled[0, 150:], x2[0, 150:151].expand(150, -1), atol=1e-6, rtol=0)


def test_pooling_continues_from_a_state():
    x, w = _data(100, torch.float64, 3, scale=30.0)
    whole, _ = causal_pool(x, w, 4)
    first, state = causal_pool(x[:, :37], w, 4)
    rest, _ = causal_pool(x[:, 37:], w, 4, state=state)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, atol=1e-12, rtol=0)


def test_pooling_weights_are_the_reference_matrices():
    x, w = _data(20, torch.float64, 4, scale=3.0)
    mask = _ones(x)
    mask[1, :5] = 0  # left padding in the second row
    a = pooling_weights(x, w, 4, mask)
    torch.testing.assert_close(a, ref.pooling_matrix(x, w, 4, mask), atol=1e-14, rtol=0)
    assert torch.equal(a, a.tril())
    torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1], dtype=a.dtype))
    pooled, _ = causal_pool(x, w, 4, mask)
    per_head = (a @ x.view(2, 20, 4, 8).transpose(1, 2)).transpose(1, 2).reshape(2, 20, 32)
    torch.testing.assert_close(pooled, per_head, atol=1e-12, rtol=0)


def test_padding_tokens_get_no_weight():
    x, w = _data(30, torch.float64, 6, scale=3.0)
    mask = _ones(x)
    mask[0, :7] = 0  # left padding
    pooled, _ = causal_pool(x, w, 4, mask)
    alone, _ = causal_pool(x[:1, 7:], w, 4)
    # exp(-1e4) is exactly 0 next to a real token's weight, in float64 too.
    torch.testing.assert_close(pooled[0, 7:], alone[0], atol=1e-14, rtol=0)


# --- the model ----------------------------------------------------------------------


@pytest.mark.parametrize("convolve", [False, True])
def test_shared_format_folder_loads_and_gives_reference_logits(tmp_path, convolve):
    config = tiny_config(convolve=convolve, groups=2 if convolve else 1)
    stored = dict(config)
    del stored["n_heads"]  # older files have no n_heads: it means 4
    sd = write_shared_format(tmp_path, stored)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert isinstance(model, FastformerForCausalLM) and model.config.n_heads == 4
    assert AutoConfig.from_pretrained(tmp_path).num_attention_heads == 4
    ids = torch.randint(1, 80, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
    want, _ = ref.forward(sd, stored, ids, mask)
    # float64 through 3 layers of LayerNorm, products and pooled sums: ~1e-14 apart.
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert model.proj_logits.weight.data_ptr() == model.word_embedding.weight.data_ptr()


def test_float32_model_matches_float64_reference():
    model = tiny_fastformer(dtype=torch.float32)
    sd = {k: v.double() for k, v in model.state_dict().items()}
    ids = torch.randint(1, 80, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(ids).logits
    want, _ = ref.forward(sd, tiny_config(), ids)
    # float32 rounding (6e-8) grown through 3 layers with LayerNorms; logits are O(1).
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)


def test_causality():
    model = tiny_fastformer(convolve=True, groups=2)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 80, (1, 60), generator=gen)
    with torch.no_grad():
        base = model(ids).logits
        for i in (0, 10, 63 - 4, 59):
            changed = ids.clone()
            changed[0, i + 1 :] = torch.randint(1, 80, (59 - i,), generator=gen)
            other = model(changed).logits
            # Later tokens enter earlier rows only multiplied by an exact 0: bitwise equal.
            assert torch.equal(other[0, : i + 1], base[0, : i + 1]), i
            if i < 59:
                assert not torch.equal(other[0, i + 1 :], base[0, i + 1 :])


def test_loss_is_shifted_cross_entropy():
    model = tiny_fastformer()
    ids = torch.randint(1, 80, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(ids, labels=ids)
    logp = out.logits[:, :-1].log_softmax(-1)
    want = -logp.gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(out.loss.double(), want, atol=1e-12, rtol=0)


def test_save_pretrained_round_trip(tmp_path):
    model = tiny_fastformer(seed=4, convolve=True, groups=4)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "FastformerForCausalLM" and saved["n_heads"] == 4
    back = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    for (name, p), (name2, q) in zip(
        model.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert name == name2 and torch.equal(p, q), name
    ids = torch.randint(1, 80, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, back(ids).logits)


def test_model_is_built_from_config_with_defaults():
    config = FastformerConfig()
    assert (config.hidden_size, config.n_heads, config.num_hidden_layers) == (256, 4, 4)
    with pytest.raises(ValueError, match="multiple of n_heads"):
        FastformerForCausalLM(FastformerConfig(hidden_size=30, n_heads=4, vocab_size=10))


def _greedy_by_recomputation(model, ids, steps):
    for _ in range(steps):
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("convolve", [False, True])
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_equals_greedy_recomputation(convolve, use_cache):
    model = tiny_fastformer(seed=6, convolve=convolve, groups=2)
    ids = torch.randint(1, 80, (2, 7), generator=torch.Generator().manual_seed(7))
    want = _greedy_by_recomputation(model, ids, 12)
    got = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=12,
        do_sample=False,
        use_cache=use_cache,
        pad_token_id=0,
    )
    assert torch.equal(got, want)


def test_cached_step_equals_full_forward():
    model = tiny_fastformer(seed=8, convolve=True, groups=1)
    ids = torch.randint(1, 80, (2, 30), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :20], use_cache=True)
        steps = [out.logits]
        cache = out.past_key_values
        for i in range(20, 30):
            out = model(ids[:, i : i + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
    assert cache.get_seq_length() == 30
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=0)


def test_beam_search_with_cache_equals_beam_search_without():
    """Beam search reorders the cache rows (FastformerCache.reorder_cache)."""
    model = tiny_fastformer(seed=3, convolve=True, groups=2)
    ids = torch.randint(1, 80, (2, 6), generator=torch.Generator().manual_seed(1))
    runs = [
        model.generate(
            ids, max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0, use_cache=c
        )
        for c in (True, False)
    ]
    assert torch.equal(*runs)
