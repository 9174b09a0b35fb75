"""Hook-based ablations against the module-surgery reference, for every family and preset."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.models import ADAPTERS
from probe.names import SURGERIES
from probe.surgery.ablate import PRESETS, VARIANTS, Ablation, parse_variants, variant_from_flags
from tests.reference.surgery import model_family, reference_hidden_states
from tests.reference.tiny import FAMILIES, tiny_model

# float32 only: the hooks and the surgery run the same operations, but nnsight's
# .skip/.inputs paths may hand tensors through in another memory layout, which can
# change BLAS's summation order; a following LayerNorm amplifies that to ~1e-6.
TOL_FLOAT32 = 1e-5


def _ids(seed=0, batch=3, tokens=9, vocab=80):
    return torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _padded(ids):
    """A mask with padding at the end of the last two rows (right padding, as tokenizers do)."""
    mask = torch.ones_like(ids)
    mask[-1, 5:] = 0
    mask[-2, 7:] = 0
    return mask


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("surgery", SURGERIES)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_hooks_equal_reference_surgery_exactly(family, variant, surgery, padded):
    """In float64 the hooks reach the very additions the surgery rewrites: equal to the bit."""
    model = tiny_model(family)
    ablation = PRESETS[variant].with_surgery(surgery)
    ids = _ids()
    mask = _padded(ids) if padded else None
    got = probe.hidden_states(probe.wrap(model), ids, ablation, attention_mask=mask)
    want = reference_hidden_states(
        model, ids, mask, attn_skip=ablation.attn_skip, mlp=ablation.mlp, surgery=surgery
    )
    assert len(got) == len(want) == model.config.num_hidden_layers + 1
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, (layer, g.shape, w.shape)
        # Compare real tokens only: padded positions hold whatever the model computes there.
        real = torch.ones(g.shape[:2], dtype=torch.bool) if mask is None else mask.bool()
        assert torch.equal(g[real], w[real]), (
            f"{family} {variant} {surgery} layer {layer}: max |diff| "
            f"{(g[real] - w[real]).abs().max().item():.3g}"
        )


def test_paper_surgery_differs_only_for_albert_without_mlp():
    ids = _ids(6)
    for family in FAMILIES:
        model = tiny_model(family)
        probed = probe.wrap(model)
        for variant in VARIANTS:
            ours = probe.hidden_states(probed, ids, PRESETS[variant])[-1]
            paper = probe.hidden_states(probed, ids, PRESETS[variant].with_surgery("paper"))[-1]
            differs = family == "albert" and not PRESETS[variant].mlp
            assert (not torch.equal(ours, paper)) == differs, (family, variant)


def test_albert_paper_surgery_is_ln_of_gelu_plus_attention():
    """Hand-derived: with ffn, ffn_output as identities the layer outputs LN(act(a) + a).

    act is the config's hidden_act (gelu_new for ALBERT), the gelu of the paper's wording.
    """
    model = tiny_model("albert")
    ids = _ids(7)
    layer = model.encoder.albert_layer_groups[0].albert_layers[0]
    states = probe.hidden_states(probe.wrap(model), ids, probe.SAN_SKIP.with_surgery("paper"))
    with torch.no_grad():
        x = states[0]
        for depth in range(1, len(states)):
            a = layer.attention(x)[0]
            x = layer.full_layer_layer_norm(layer.activation(a) + a)
            # The same operations in the same order as ALBERT's own code: exact.
            assert torch.equal(x, states[depth]), depth


#: Families whose tiny model and reference live in their own modules (the Fastformer is a
#: causal LM with no base model, so tests/reference/tiny.py's base-model tests do not fit it):
#: family -> (tiny-model module, reference module), both under tests/.
SEPARATELY_COVERED = {"fastformer": ("tests.fastformer_tiny", "tests.reference.fastformer")}


def test_every_registered_family_is_covered_by_the_references():
    """A family added to the registry must come with a tiny model and a reference surgery."""
    import importlib

    from tests.reference.tiny import TINY_CONFIGS

    # The walker's families: tests/test_families.py with tests/reference/layers.py.
    assert set(ADAPTERS) == set(FAMILIES) | set(SEPARATELY_COVERED) | set(TINY_CONFIGS)
    for family in FAMILIES:
        assert model_family(tiny_model(family)) == family
    for tiny, reference in SEPARATELY_COVERED.values():
        assert importlib.import_module(tiny).tiny_fastformer is not None
        assert importlib.import_module(reference).forward is not None


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
        torch.testing.assert_close(g, w, atol=TOL_FLOAT32, rtol=0)


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


@pytest.mark.parametrize("family", FAMILIES)
def test_wrap_leaves_the_users_modules_as_they_were(family):
    """After wrap and ablated runs every module of the caller's model has the same
    instance attributes (no nnsight controller left behind) and the weights are shared,
    not copied."""
    model = tiny_model(family)
    before = {name: set(m.__dict__) for name, m in model.named_modules()}
    forwards = {name: type(m).forward for name, m in model.named_modules()}
    probed = probe.wrap(model)
    for variant in VARIANTS:
        probe.hidden_states(probed, _ids(8), PRESETS[variant])
    assert {name: set(m.__dict__) for name, m in model.named_modules()} == before
    assert {name: type(m).forward for name, m in model.named_modules()} == forwards
    for mine, theirs in zip(model.parameters(), probed.model.parameters(), strict=True):
        assert mine is theirs
