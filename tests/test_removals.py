"""The removal variants no-sink and no-massive against module surgery.

``tests/reference/removals.py`` removes the sinks inside an eager attention of its own
(probabilities zeroed and each row renormalised) and replaces the massive entries with
forward hooks; the walker's edits must give the same residual stream, in float64, on every
walker family whose attention calls transformers' attention functions (BLOOM, Falcon and
DeBERTa-v2 compute their own softmax and refuse no-sink in one line).  The clean pass that
finds what to remove is checked against loops over HF's own ``output_attentions``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probe
from probe.analyses import collapse
from probe.errors import ProbeError
from probe.surgery import masks, removals
from probe.surgery.ablate import TRANSFORMER, Ablation, parse_variants
from tests.paths_tiny import (
    one_thread,  # noqa: F401  (autouse: one torch thread here)
    padded_inputs,
    path_model,
)
from tests.reference import own_masks
from tests.reference.attention import register as reference_attention
from tests.reference.masked_attention import use as use_mask
from tests.reference.removals import (
    clean_hidden_states,
    found,
    no_massive_hidden_states,
    no_sink_hidden_states,
)
from tests.reference.tiny import tiny_model
from tests.test_paths_sample import NAMES, _hf_attentions

OWN_SOFTMAX = ("bloom", "deberta-v2", "falcon")
#: Every walker family (and config branch) whose attention dispatches to transformers'.
SINK_NAMES = [n for n in NAMES if n not in ("albert", "xlnet") and not n.startswith(OWN_SOFTMAX)]
WALKER_NAMES = [n for n in NAMES if n not in ("albert", "xlnet")]


def _call(model, inputs):
    """The reference's forward keywords: no key/value cache, as probe runs decoders."""
    import inspect

    extra = (
        {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    )
    return {**inputs, **extra}


def _sinks(probed):
    """Per layer: head 0 loses key 0; the last head keys 0 and 2 (two sinks in one head)."""
    last = probed.adapter.n_heads(probed.config) - 1
    return tuple(
        entry
        for layer in range(1, probed.n_layers + 1)
        for entry in ((layer, 0, 0), (layer, last, 0), (layer, last, 2))
    )


@pytest.mark.parametrize("name", SINK_NAMES)
def test_no_sink_equals_module_surgery(name):
    model = path_model(name)
    probed = probe.wrap(model)
    inputs, data, mask = padded_inputs(model)
    ablation = Ablation(remove="sinks", sinks=_sinks(probed))
    got = probe.hidden_states(probed, data, ablation, mask)
    want = no_sink_hidden_states(path_model(name), _call(model, inputs), ablation.sinks)
    clean = probe.hidden_states(probed, data, TRANSFORMER, mask)
    real = mask.bool()
    assert len(got) == len(want) == probed.n_layers + 1
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        # The same removal reached two ways (the sink's score at the dtype's minimum against
        # probabilities zeroed and renormalised): a few ulps per probability, through <= 3
        # tiny float64 layers whose entries stay below ~10.
        np.testing.assert_allclose(g[real], w[real], rtol=0, atol=1e-12, err_msg=f"layer {layer}")
    assert (got[-1][real] - clean[-1][real]).abs().max() > 1e-3  # the removal matters
    again = probe.hidden_states(probed, data, TRANSFORMER, mask)  # and leaves the model as it was
    assert all(torch.equal(a, b) for a, b in zip(again, clean, strict=True))


def test_a_row_that_sees_only_sinks_keeps_its_attention():
    """GPT-2's first token sees only itself: removing key 0 leaves its row as it was, so
    X_l of token 0 is the clean run's bit for bit; the other tokens change."""
    model = path_model("gpt2")
    probed = probe.wrap(model)
    inputs, data, mask = padded_inputs(model)
    sinks = tuple((layer, h, 0) for layer in (1, 2) for h in range(4))
    got = probe.hidden_states(probed, data, Ablation(remove="sinks", sinks=sinks), mask)
    clean = probe.hidden_states(probed, data, TRANSFORMER, mask)
    for g, c in zip(got[1:], clean[1:], strict=True):
        assert torch.equal(g[:, 0], c[:, 0])
        assert (g[:, 1] - c[:, 1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", WALKER_NAMES)
def test_no_massive_equals_module_surgery_exactly(name):
    model = path_model(name)
    probed = probe.wrap(model)
    inputs, data, mask = padded_inputs(model)
    massive = tuple(
        entry
        for layer in range(1, probed.n_layers + 1)
        for entry in ((layer, 0, 1, 5.0 * layer), (layer, 3, 2, -7.25), (layer, 3, 5, 0.5))
    )
    got = probe.hidden_states(probed, data, Ablation(remove="massive", massive=massive), mask)
    reference = path_model(name)
    if probed.attn_implementation == "probe_eager":  # the reference keeps float64 too
        reference.config._attn_implementation = reference_attention()
    want = no_massive_hidden_states(reference, _call(model, inputs), massive)
    real = mask.bool()
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        # The same values set at the same places before the same operations: identical bits.
        assert torch.equal(g[real], w[real]), f"{name} layer {layer}"
    assert float(got[1][0, 0, 1]) == 5.0 and float(got[2][2, 3, 2]) == -7.25


@pytest.mark.parametrize("text", ["model", "bidirectional", "window:1", "causal-window:2"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "gemma2"])
def test_the_clean_pass_finds_what_loops_over_hf_attentions_find(name, text):
    """Under the model's own mask (gemma2's sliding layers included) and masks of the run's
    own: a key's attention is averaged over the rows the run's mask let see it."""
    model = path_model(name)
    probed = probe.wrap(model)
    inputs, data, mask = padded_inputs(model)
    run_mask = masks.effective(probed, masks.parse_mask(text))
    L, T = probed.n_layers, mask.shape[1]
    if run_mask.is_model:
        attn = reference_attention() if probed.attn_implementation == "probe_eager" else None
        allowed = own_masks.allowed(model.config, L, T)
    else:
        attn = use_mask(run_mask.kind, run_mask.width, mask)
        allowed = own_masks.allowed(model.config, L, T, run_mask.kind, run_mask.width)
    hf = _hf_attentions(model, inputs, attn).numpy()
    reference = path_model(name)
    if attn is not None:
        reference.config._attn_implementation = attn
    states = clean_hidden_states(reference, _call(model, inputs))
    eps, ratio = 0.25, 3.0  # low enough that these random tiny models have both
    want_sinks, want_massive = found(hf, states, mask.numpy(), eps, ratio, allowed)
    batches = [(0, data[:2], mask[:2]), (2, data[2:], mask[2:])]  # two batches add up
    with masks.applied([probed], run_mask):
        got = removals.find(
            probed, batches, True, True, epsilon=eps, ratio=ratio, run_mask=run_mask
        )
    assert list(got.sinks) == want_sinks
    assert [e[:3] for e in got.massive] == [e[:3] for e in want_massive]
    # Means of <= 3 float64 values, summed in another order: a few ulps of values below ~20.
    np.testing.assert_allclose(
        [e[3] for e in got.massive], [e[3] for e in want_massive], rtol=0, atol=1e-13
    )
    if text == "model":
        assert want_massive  # the check is not vacuous
    else:
        assert want_sinks  # under a window, each key is seen by at most 2 W + 1 rows
    if name == "gpt2":
        assert want_sinks  # a causal model's first token


@pytest.mark.parametrize("text", ["bidirectional", "window:1", "causal-window:2"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_no_sink_under_a_mask_of_the_runs_own_equals_module_surgery(name, text):
    """The no-sink edit closes the sink keys in the mask the run applies, not in the model's
    mask that a mask of the run's own replaces: the reference removes them inside its own
    attention under the pattern it builds itself."""
    model = path_model(name)
    probed = probe.wrap(model)
    inputs, data, mask = padded_inputs(model)
    run_mask = masks.parse_mask(text)
    ablation = Ablation(remove="sinks", sinks=_sinks(probed))
    with masks.applied([probed], run_mask):
        got = probe.hidden_states(probed, data, ablation, mask)
        clean = probe.hidden_states(probed, data, TRANSFORMER, mask)
    allowed = own_masks.allowed(
        model.config, probed.n_layers, mask.shape[1], run_mask.kind, run_mask.width
    )
    want = no_sink_hidden_states(path_model(name), _call(model, inputs), ablation.sinks, allowed)
    real = mask.bool()
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        # As test_no_sink_equals_module_surgery: the same removal reached two ways.
        np.testing.assert_allclose(g[real], w[real], rtol=0, atol=1e-12, err_msg=f"layer {layer}")
    assert (got[-1][real] - clean[-1][real]).abs().max() > 1e-3  # the removal matters


def test_collapse_runs_the_removals_in_two_passes():
    model = tiny_model("gpt2")
    options = {"sequences": 4, "tokens": 8, "batch_size": 2, "metrics": "relative_residual"}
    ds = collapse.run(model, variants="transformer,no-sink,no-massive", **options)
    alone = collapse.run(tiny_model("gpt2"), variants="transformer", **options)
    r = ds.relative_residual
    # The transformer's numbers do not move when the removal variants run beside it.
    assert np.array_equal(
        r.sel(variant="transformer"), alone.relative_residual.sel(variant="transformer")
    )
    import json

    removed = json.loads(ds.attrs["removed"])
    sinks = [tuple(e) for e in removed["no-sink"]["pretrained"]]
    # GPT-2's first token, and later keys whose few rows (those that can see them, Gu et
    # al.'s normalisation) put more than eps on them.
    assert sinks and any(k == 0 for _, _, k in sinks)
    assert not np.array_equal(r.sel(variant="no-sink"), r.sel(variant="transformer"))
    # Nothing is 100x the median in this tiny model: no-massive is the transformer, and says so.
    assert removed["no-massive"]["pretrained"] == []
    assert np.array_equal(r.sel(variant="no-massive"), r.sel(variant="transformer"))
    assert (
        "no-massive (pretrained): the clean run finds nothing massive" in ds.attrs["removal_note"]
    )
    assert parse_variants("no-massive,no-sink,SAN") == ["SAN", "no-sink", "no-massive"]


@pytest.mark.parametrize("name", ["albert", "fastformer"])
def test_families_outside_the_walker_refuse_in_one_line(name):
    model = path_model(name)
    with pytest.raises(ProbeError, match="removal variants .* need a family spec"):
        collapse.prepare(model, variants="no-massive", sequences=2, tokens=6)


def test_an_attention_with_its_own_softmax_refuses_no_sink():
    with pytest.raises(ProbeError, match="bloom attention computes its own softmax"):
        collapse.prepare(path_model("bloom"), variants="no-sink", sequences=2, tokens=6)


def test_removal_variants_are_of_the_full_transformer():
    with pytest.raises(ProbeError, match="full transformer"):
        Ablation(mlp=False, remove="sinks")
    assert Ablation(remove="sinks").name == "no-sink"
    assert Ablation(remove="massive", massive=((1, 0, 0, 1.0),)).name == "no-massive"
    assert not Ablation(remove="sinks").is_identity


def test_a_family_outside_the_walker_never_runs_a_removal_silently():
    probed = probe.wrap(tiny_model("albert"))
    ids = torch.randint(3, 50, (1, 5))
    with pytest.raises(ProbeError, match="removal variants .* need a family spec"):
        probe.hidden_states(probed, ids, Ablation(remove="massive", massive=((1, 0, 0, 1.0),)))
