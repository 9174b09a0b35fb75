"""The LayerNorm variants (``--no-layernorm``: LN-affine, no-LN) against module surgery.

``tests/reference/norms.py`` replaces each norm module of every layer by hand (its
own list of norms per family) on a copy of the model; the walker's steps must give
the same residual stream to the bit in float64, on BERT (post-LN LayerNorm), GPT-2
(pre-LN LayerNorm), Llama (RMSNorm), Gemma and Gemma2 (RMSNorm with 1 + w; Gemma2's
four norms), post-LN OPT, OLMo2 (norms on the sublayers' outputs only), BLOOM, ModernBERT
(an Identity in its first layer where the others have a norm), Falcon (a norm registered
before the one its forward calls first), StableLM (per-head q/k norms, which stay), Cohere
and Granite.
"""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import probe
from probe.cli.app import app
from probe.errors import ProbeError
from probe.models import ADAPTERS
from probe.models import spec as spec_module
from probe.surgery.ablate import LN_AFFINE, NO_LN, PRESETS, TRANSFORMER, Ablation, parse_variants
from probe.surgery.self_test import identities
from tests.reference.attention import register as register_reference_attention
from tests.reference.layers import reference_hidden_states as layer_reference
from tests.reference.norms import norm_variant_hidden_states, with_norms
from tests.reference.surgery import reference_hidden_states as surgery_reference
from tests.reference.tiny import FAMILIES as ORIGINAL
from tests.reference.tiny import tiny_model
from tests.test_families import _family, _inputs, _model

CASES = [
    "bert",
    "distilbert",
    "t5",
    "gpt2",
    "llama",
    "gemma",
    "gemma2",
    "opt-post-ln",
    "olmo2",
    "bloom",
    "modernbert",
    "falcon-sequential",
    "falcon-new-architecture",
    "stablelm",
    "stablelm-parallel",
    "cohere-qk-norm",
    "granite",
]


@pytest.mark.parametrize("mode", ["affine", "removed"])
@pytest.mark.parametrize("name", CASES)
def test_norm_variants_equal_module_surgery_exactly(name, mode):
    model = _model(name)
    family = _family(model)
    spec = ADAPTERS[family].spec
    inputs = _inputs(model, padded=True)
    probed = probe.wrap(model)
    ablation = Ablation(norm=mode)
    got = probe.hidden_states(probed, inputs["input_ids"], ablation, inputs["attention_mask"])
    reference = _model(name)
    if spec.float32_softmax:  # probe keeps float64 in the softmax; so does the reference
        reference.config._attn_implementation = register_reference_attention()
    call = {**inputs, **{k: v for k, v in spec.forward_kwargs.items() if k == "use_cache"}}
    want = norm_variant_hidden_states(reference, family, call, mode)
    clean = probe.hidden_states(probed, inputs["input_ids"], TRANSFORMER, inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    assert len(got) == len(want) == len(clean)
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        # float64 on the CPU, the same operations on both sides: identical bits.
        assert torch.equal(g[real], w[real]), f"{name} {mode} layer {layer}"
    # The variant changes the stream after the first layer (the norms matter) ...
    assert not torch.equal(got[-1][real], clean[-1][real])
    # ... and leaves the model as it was: a clean run after it is a fresh model's.
    again = probe.hidden_states(probed, inputs["input_ids"], TRANSFORMER, inputs["attention_mask"])
    assert all(torch.equal(a, b) for a, b in zip(again, clean, strict=True))


#: Composed variants refused: a norm the MLP keeps, called from two places of the forward
#: (the branches of a config), whose edit has no one place in nnsight's order.
ONE_PLACE_UNKNOWN = {("opt-post-ln", "SAN+MLP"), ("t5", "SAN+MLP")}


@pytest.mark.parametrize("variant", ["SAN", "SAN+MLP", "SAN+skip"])
@pytest.mark.parametrize("mode", ["affine", "removed"])
@pytest.mark.parametrize("name", CASES)
def test_composed_norm_variants_equal_module_surgery_exactly(name, mode, variant):
    # SAN/no-LN and the rest: the norms replaced in a copy (tests/reference/norms.py), then
    # the skip or MLP removed by the layers' own reference surgery (tests/reference/layers.py).
    model = _model(name)
    family = _family(model)
    spec = ADAPTERS[family].spec
    inputs = _inputs(model, padded=True)
    probed = probe.wrap(model)
    ablation = PRESETS[f"{variant}/{'LN-affine' if mode == 'affine' else 'no-LN'}"]
    plain = PRESETS[variant]
    if (name, variant) in ONE_PLACE_UNKNOWN:
        with pytest.raises(ProbeError, match="from more than one place of its forward"):
            probe.hidden_states(probed, inputs["input_ids"], ablation, inputs["attention_mask"])
        return
    got = probe.hidden_states(probed, inputs["input_ids"], ablation, inputs["attention_mask"])
    reference = _model(name)
    if spec.float32_softmax:  # probe keeps float64 in the softmax; so does the reference
        reference.config._attn_implementation = register_reference_attention()
    call = {**inputs, **{k: v for k, v in spec.forward_kwargs.items() if k == "use_cache"}}
    normed = with_norms(reference, family, mode)
    removed = {"attn_skip": plain.attn_skip, "mlp": plain.mlp}
    if name in ORIGINAL:  # their layers are re-implemented in tests/reference/surgery.py
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        want = surgery_reference(normed, ids, mask, **removed)
    else:
        want = layer_reference(normed, call, **removed)
    without = probe.hidden_states(probed, inputs["input_ids"], plain, inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        # float64 on the CPU, the same operations on both sides: identical bits.
        assert torch.equal(g[real], w[real]), f"{name} {variant}/{mode} layer {layer}"
    assert not torch.equal(got[-1][real], without[-1][real])  # the norms matter here too


def test_the_two_norm_variants_differ_and_are_named():
    assert PRESETS["LN-affine"] == LN_AFFINE and PRESETS["no-LN"] == NO_LN
    assert LN_AFFINE.name == "LN-affine" and NO_LN.name == "no-LN"
    assert parse_variants("all") == ["SAN", "SAN+MLP", "SAN+skip", "transformer"]
    assert parse_variants("no-ln,SAN") == ["SAN", "no-LN"]
    # On the paper's other networks, one name each: pure attention is SAN/no-LN.
    assert Ablation(attn_skip=False, mlp=False, norm="removed").name == "SAN/no-LN"
    assert PRESETS["SAN+skip/LN-affine"] == Ablation(mlp=False, norm="affine")
    assert parse_variants("san/no-ln,SAN") == ["SAN", "SAN/no-LN"]
    with pytest.raises(ProbeError, match="removal variants"):
        Ablation(norm="removed", remove="sinks")


@pytest.mark.parametrize("family", ["albert", "xlnet"])
def test_families_outside_the_walker_refuse_in_one_line(family):
    probed = probe.wrap(tiny_model(family))
    ids = torch.randint(3, 50, (1, 5))
    with pytest.raises(ProbeError, match="LayerNorm variants .* need a family spec"):
        probe.hidden_states(probed, ids, NO_LN)


def test_collapse_no_layernorm_on_the_cli(tmp_path):
    folder = tmp_path / "gpt2"
    tiny_model("gpt2").save_pretrained(folder)
    out = tmp_path / "out"
    args = ["collapse", str(folder), "--no-layernorm", "--variants", "transformer"]
    args += ["--init", "pretrained", "--sequences", "2", "--tokens", "6", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    ds = probe.open_result(next(out.glob("*.nc"))) if hasattr(probe, "open_result") else None
    if ds is None:
        import xarray as xr

        ds = xr.open_dataset(next(out.glob("*.nc")))
    assert list(ds.variant.values) == ["transformer", "LN-affine", "no-LN"]
    r = ds.relative_residual.sel(fit="mean", norm="l1inf").isel(layer=-1)
    assert len({round(float(r.sel(variant=v).mean()), 12) for v in ds.variant.values}) == 3
    # A family outside the walker: one line, exit 2, nothing written.
    folder = tmp_path / "albert"
    tiny_model("albert").save_pretrained(folder)
    result = CliRunner().invoke(app, ["collapse", str(folder), "--no-layernorm", "--out", str(out)])
    assert result.exit_code == 2 and "need a family spec" in result.output


@pytest.mark.parametrize(
    ("name", "fails"),
    [
        # pre-LN: the layer stays x + branch, with the norm inside the branch; the first
        # layer against the torch-hooked model finds the norm left in
        ("gpt2", ["SAN+skip/LN-affine at layer 1", "SAN+skip/no-LN at layer 1"]),
        # post-LN: the sublayer norm applied after the branch is what is left in
        ("bert", ["SAN/LN-affine", "SAN+skip/LN-affine", "SAN/no-LN", "SAN+skip/no-LN"]),
    ],
)
def test_the_self_test_finds_a_composed_variant_that_kept_its_norms(name, fails, monkeypatch):
    probed = probe.wrap(_model(name))  # the self-test passes as the walker is
    monkeypatch.setattr(spec_module, "merged", lambda layer, steps, norms, family: steps)
    found = identities(probed)
    # 4 float64 epsilons: the MLP-branch identity's own rounding (tests/test_families.py)
    eps = torch.finfo(torch.float64).eps
    failing = [i.name.split(" = ")[0] for i in found if not i.holds(4 * eps)]
    assert failing == fails
