"""Hook-based ablations against the module-surgery reference, for every family and preset."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.ablate import PRESETS, VARIANTS, Ablation, parse_variants, variant_from_flags
from tests.reference.surgery import reference_hidden_states
from tests.reference.tiny import FAMILIES, tiny_model

TOL = 1e-5


def _ids(seed=0, batch=3, tokens=9, vocab=80):
    return torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_hooks_equal_reference_surgery(family, variant):
    model = tiny_model(family)
    ablation = PRESETS[variant]
    ids = _ids()
    got = probe.hidden_states(probe.wrap(model), ids, ablation)
    want = reference_hidden_states(model, ids, attn_skip=ablation.attn_skip, mlp=ablation.mlp)
    assert len(got) == len(want) == model.config.num_hidden_layers + 1
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, (layer, g.shape, w.shape)
        torch.testing.assert_close(g, w, atol=TOL, rtol=0, msg=f"{family} {variant} layer {layer}")


@pytest.mark.parametrize("family", FAMILIES)
def test_ablations_change_something(family):
    model = tiny_model(family)
    probed, ids = probe.wrap(model), _ids(1)
    clean = probe.hidden_states(probed, ids)
    for variant in ("SAN", "SAN+MLP", "SAN+skip"):
        ablated = probe.hidden_states(probed, ids, PRESETS[variant])
        torch.testing.assert_close(ablated[0], clean[0])  # the embeddings are untouched
        assert (ablated[-1] - clean[-1]).abs().max() > 1e-3, variant


@pytest.mark.parametrize("family", FAMILIES)
def test_clean_run_after_ablated_equals_fresh_model(family):
    model = tiny_model(family)
    ids = _ids(2)
    fresh = tiny_model(family)
    with torch.no_grad():
        want = fresh(ids, output_hidden_states=True).last_hidden_state
    probed = probe.wrap(model)
    for variant in VARIANTS:
        probe.hidden_states(probed, ids, PRESETS[variant])
    with torch.no_grad():
        got = model(ids, output_hidden_states=True).last_hidden_state
    assert torch.equal(got, want)
    again = probe.hidden_states(probed, ids)
    assert torch.equal(again[-1], probe.hidden_states(probe.wrap(fresh), ids)[-1])
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("family", FAMILIES)
def test_residual_stream_equals_output_hidden_states(family):
    model = tiny_model(family)
    ids = _ids(3)
    with torch.no_grad():
        hf = model(ids, output_hidden_states=True).hidden_states
    got = probe.hidden_states(probe.wrap(model), ids)
    assert len(got) == len(hf)
    last = len(got) - 1
    for layer, (g, h) in enumerate(zip(got, hf, strict=True)):
        if family == "gpt2" and layer == last:
            # HF applies ln_f to GPT-2's last entry; the residual stream is read before it.
            with torch.no_grad():
                torch.testing.assert_close(model.ln_f(g), h, atol=1e-12, rtol=0)
            assert (g - h).abs().max() > 1e-3
        else:
            torch.testing.assert_close(g, h, atol=1e-12, rtol=0, msg=f"{family} layer {layer}")


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_hooks_match_reference(family):
    model = tiny_model(family, dtype=torch.float32)
    ids = _ids(4)
    got = probe.hidden_states(probe.wrap(model), ids, probe.SAN)
    want = reference_hidden_states(model, ids, attn_skip=False, mlp=False)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=TOL, rtol=0)


def test_padded_batch_matches_unpadded_rows():
    model = tiny_model("bert")
    ids = _ids(5, batch=2, tokens=8)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    probed = probe.wrap(model)
    batched = probe.hidden_states(probed, ids, probe.SAN, attention_mask=mask)
    alone = probe.hidden_states(probed, ids[1:, :5], probe.SAN)
    torch.testing.assert_close(batched[-1][1, :5], alone[-1][0], atol=1e-10, rtol=0)


def test_presets_and_names():
    assert [PRESETS[v].name for v in VARIANTS] == list(VARIANTS)
    assert PRESETS["SAN"] == Ablation(attn_skip=False, mlp=False)
    assert PRESETS["transformer"].is_identity
    assert variant_from_flags(no_skip=True, no_mlp=False) == "SAN+MLP"
    assert variant_from_flags(no_skip=True, no_mlp=True) == "SAN"
    assert variant_from_flags(no_skip=False, no_mlp=True) == "SAN+skip"
    assert parse_variants("all") == list(VARIANTS)
    assert parse_variants("transformer, san") == ["SAN", "transformer"]
    with pytest.raises(probe.ProbeError, match="unknown variant nope"):
        parse_variants("SAN,nope")


def test_wrap_never_changes_a_training_model():
    model = tiny_model("bert").train()
    probed = probe.wrap(model)
    assert model.training and probed.model is not model
    assert not probed.model.training
