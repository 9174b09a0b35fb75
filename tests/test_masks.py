"""Attention masks chosen by the run (probe.surgery.masks; Wu et al. 2024).

* every mask, on the tiny config of every family the walker runs, in float64 and with
  padding: probe's hidden states equal a hand-written masked attention's
  (``tests/reference/masked_attention.py``, its own padding and its own loops), run through
  the independent references of the clean model and of SAN, bit for bit;
* a family whose attention probe cannot mask is refused in one line, before any load;
* ``causal`` on a causal model is the model's own run, and the result says so;
* the command line: collapse, attention and a sweep with a mask axis, a misspelled mask,
  a window of 0, a mask the Fastformer cannot take.
"""

from __future__ import annotations

import pytest
import torch
import xarray as xr
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import probe
from probe.analyses import attention, collapse
from probe.cli.app import app
from probe.models import ADAPTERS
from probe.surgery import masks
from probe.surgery.ablate import SAN, TRANSFORMER
from tests.reference.attention import register as register_reference_attention
from tests.reference.layers import reference_hidden_states as layer_reference
from tests.reference.masked_attention import pattern, use
from tests.reference.surgery import reference_hidden_states as surgery_reference
from tests.reference.tiny import FAMILIES as ORIGINAL
from tests.test_families import TINY, _family, _inputs, _model

MASKS = ("bidirectional", "causal", "window:1", "causal-window:2")


def _reference(name: str, ablation, inputs: dict, mask: masks.Mask | None) -> list[torch.Tensor]:
    """The independent surgery on the model under ``mask`` (the hand-written masked
    attention), or, None, under its own attention."""
    model = _model(name)
    if mask is not None:
        padding = inputs.get("attention_mask")
        model.config._attn_implementation = use(mask.kind, mask.width, padding)
    elif name not in ORIGINAL and ADAPTERS[_family(model)].spec.float32_softmax:
        model.config._attn_implementation = register_reference_attention()  # float64 kept
    if name in ORIGINAL:
        args = (inputs["input_ids"], inputs["attention_mask"])
        return surgery_reference(model, *args, attn_skip=ablation.attn_skip, mlp=ablation.mlp)
    spec = ADAPTERS[_family(model)].spec
    call = {**inputs, **{k: v for k, v in spec.forward_kwargs.items() if k == "use_cache"}}
    return layer_reference(model, call, attn_skip=ablation.attn_skip, mlp=ablation.mlp)


@pytest.mark.parametrize("ablation", [SAN, TRANSFORMER], ids=["SAN", "transformer"])
@pytest.mark.parametrize("text", MASKS)
@pytest.mark.parametrize("name", TINY)
def test_every_mask_equals_a_hand_written_masked_attention(name, text, ablation):
    mask = masks.parse_mask(text)
    model = _model(name)
    inputs = _inputs(model, padded=model.config.model_type != "vit")
    probed = probe.wrap(model)
    try:
        masks.check(probed, mask)
    except probe.ProbeError as err:  # said in one line, naming why
        assert "probe cannot mask it" in str(err) or "ALiBi" in str(err)
        assert masks.effective(probed, mask) == mask
        return
    data = inputs.get("input_ids", inputs.get("pixel_values"))
    padding = inputs.get("attention_mask")
    with masks.applied([probed], mask):
        got = probe.hidden_states(probed, data, ablation, attention_mask=padding)
    # The hand-written masked attention also where the mask is the model's own (causal on a
    # causal model, bidirectional on an encoder), which then runs unmasked.
    own = masks.effective(probed, mask).is_model and not masks._dispatches(probed)
    want = _reference(name, ablation, inputs, None if own else mask)  # T5: its own softmax
    real = torch.ones(got[0].shape[:2], dtype=torch.bool) if padding is None else padding.bool()
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        # float64 on the CPU, the same operations on both sides: exactly equal.
        assert torch.equal(g[real], w[real]), (
            f"{name} {text} layer {layer}: max |diff| {(g[real] - w[real]).abs().max():.3g}"
        )


@given(
    kind=st.sampled_from(["bidirectional", "causal", "window", "causal-window"]),
    width=st.integers(1, 12),
    tokens=st.integers(1, 12),
)
def test_the_pattern_is_the_definition_entry_by_entry(kind, width, tokens):
    text = kind if kind in ("bidirectional", "causal") else f"{kind}:{width}"
    mask = masks.parse_mask(text)
    assert masks.parse_mask(mask.text) == mask
    assert torch.equal(mask.allowed(tokens), pattern(kind, mask.width, tokens))
    assert bool(mask.allowed(tokens).diagonal().all())  # every query sees itself


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("window:0", "W >= 1"),
        ("window:-2", "W >= 1"),
        ("window", "takes a width"),
        ("causal:3", "takes no width"),
        ("window:x", "whole number"),
        ("casual", "unknown mask"),
        ("", "unknown mask"),
    ],
)
def test_a_bad_mask_is_one_line(text, words):
    with pytest.raises(probe.ProbeError, match=words) as err:
        masks.parse_mask(text)
    assert "\n" not in str(err.value)


def test_bidirectional_on_an_encoder_is_its_own_run_and_says_so():
    """BERT's own mask is bidirectional: asked for, it runs the model's own attention (the
    unmasked run's numbers bit for bit), and the result says why."""
    options = {"init": "random", "sequences": 2, "tokens": 6, "variants": "SAN"}
    asked = collapse.run("minilm", mask="bidirectional", **options)
    own = collapse.run("minilm", **options)
    xr.testing.assert_identical(asked.relative_residual, own.relative_residual)
    assert asked.attrs["attention"] == own.attrs["attention"]
    assert "own mask is bidirectional, so the run is its own" in asked.attrs["mask_note"]


def test_causal_on_a_causal_model_is_its_own_run_and_says_so():
    options = {"init": "random", "sequences": 2, "tokens": 8, "variants": "SAN,transformer"}
    own = collapse.run("gpt2-tiny", **options)
    causal = collapse.run("gpt2-tiny", mask="causal", **options)
    xr.testing.assert_identical(own.relative_residual, causal.relative_residual)
    assert "own mask is causal" in causal.attrs["mask_note"]
    assert causal.attrs["attention"] == own.attrs["attention"] and causal.attrs["causal"] == 1
    assert "mask" not in own.attrs and own.attrs["settings_id"] != causal.attrs["settings_id"]


def test_a_bidirectional_pretrained_causal_lm_is_allowed_and_said_untrained_so():
    ds = attention.run("gpt2-tiny", init="pretrained", sequences=2, tokens=8, mask="bidirectional")
    assert "was trained causal" in ds.attrs["mask_note"] and ds.attrs["causal"] == 0
    assert ds.attrs["attention"] == masks.NAME
    # The masked probabilities are what the statistics read: the first token no longer
    # receives every query's whole attention at the first query.
    plain = attention.run("gpt2-tiny", init="pretrained", sequences=2, tokens=8)
    assert not ds.sink_score.equals(plain.sink_score)


def test_a_window_wider_than_the_sequence_is_the_mask_without_one():
    options = {"init": "random", "sequences": 2, "tokens": 6, "variants": "SAN"}
    wide = collapse.run("minilm", mask="window:5", **options)
    full = collapse.run("minilm", mask="bidirectional", **options)
    xr.testing.assert_identical(wide.relative_residual, full.relative_residual)
    assert "holds every key, as bidirectional" in wide.attrs["mask_note"]


def test_the_fastformer_is_refused_before_any_load(monkeypatch):
    from probe.requests.preflight import check_models

    with pytest.raises(probe.ProbeError, match="additive pooling is not T x T attention"):
        check_models(
            [probe.Model("fastformer-tiny", init="random")], probe.Inputs(), mask="window:1"
        )


def _cli(tmp_path, *args):
    return CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r")])


def test_the_command_line_runs_a_mask_and_its_report_says_so(tmp_path):
    small = ["--sequences", "2", "--tokens", "8", "--set", "n_layer=3"]
    done = _cli(tmp_path, "collapse", "gpt2-tiny", "--init", "random", "--mask",
                "causal-window:4", "--variants", "SAN", *small)  # fmt: skip
    assert done.exit_code == 0, done.output
    (nc,) = (tmp_path / "r").glob("collapse-*.nc")
    ds = probe.open_result(nc)
    assert ds.attrs["mask"] == "causal-window:4" and "--mask causal-window:4" in ds.attrs["command"]
    html = nc.with_suffix(".html").read_text()
    assert "uni-directional sliding window" in html
    done = _cli(tmp_path, "attention", "gpt2-tiny", "--init", "random", "--mask", "window:2",
                *small)  # fmt: skip
    assert done.exit_code == 0, done.output
    (nc,) = (tmp_path / "r").glob("attention-*.nc")
    assert "sliding window" in nc.with_suffix(".html").read_text()


def test_a_sweep_takes_masks_as_an_axis(tmp_path):
    done = _cli(tmp_path, "sweep", "gpt2-tiny", "--init", "random", "--mask",
                "bidirectional,causal,window:2", "--set", "n_layer=3", "--variants", "SAN",
                "--sequences", "2", "--tokens", "8")  # fmt: skip
    assert done.exit_code == 0, done.output
    (nc,) = (tmp_path / "r").glob("sweep-*.nc")
    ds = probe.open_result(nc)
    assert list(ds["mask"].values) == ["bidirectional", "causal", "window:2"]
    final = ds.final_residual.sel(variant="SAN", init="random")
    assert final.sel(mask="bidirectional") < final.sel(mask="window:2")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["collapse", "gpt2-tiny", "--mask", "casual"], "unknown mask"),
        (["collapse", "gpt2-tiny", "--mask", "window:0"], "W >= 1"),
        (["attention", "fastformer-tiny", "--init", "random", "--mask", "causal-window:1"],
         "cannot mask it"),
        (["sweep", "gpt2-tiny", "--init", "random", "--mask", "model,causal"], "same mask"),
        # An encoder's own mask is bidirectional: `model` beside it is one run.
        (["sweep", "bert-base-uncased", "--init", "random", "--mask", "model,bidirectional",
          "--dry-run"], "same mask"),
        # ViT-base's 197 tokens (196 patches and [CLS]): a window of 196 holds every key,
        # whatever --tokens says.
        (["sweep", "google/vit-base-patch16-224", "--init", "random", "--mask",
          "bidirectional,window:196", "--dry-run"], "same mask"),
        (["sweep", "google/vit-base-patch16-224", "--init", "random", "--mask",
          "model,window:400", "--tokens", "8", "--dry-run"], "same mask"),
    ],
)  # fmt: skip
def test_what_cannot_be_masked_is_one_line_and_exit_2(tmp_path, args, words):
    done = _cli(tmp_path, *args)
    assert done.exit_code == 2, done.output
    assert words in done.output and "Traceback" not in done.output
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").glob("*.nc"))
