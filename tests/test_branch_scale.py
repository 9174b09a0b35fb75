"""Residual branch scaling (``branch_scale``, Noci et al. 2022) against module surgery.

``tests/reference/branch_scale.py`` wraps, on a copy of each tiny model, the modules that
produce every layer's attention and MLP branch so their outputs are multiplied by alpha
(its own list of modules per family, from the transformers source); the walker's scale
steps must give the same residual stream to the bit in float64, for every spec family and
config branch, under the paper's four variants (composed with the hand-written ablations
of ``tests/reference/layers.py`` and ``surgery.py``) and against the model's own forward.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import probe
from probe.errors import ProbeError
from probe.models import ADAPTERS
from probe.surgery.ablate import PRESETS, TRANSFORMER, VARIANTS, Ablation
from probe.surgery.scaling import parse_branch_scale
from tests.reference.attention import register as register_reference_attention
from tests.reference.branch_scale import layer_stream, scaled_copy
from tests.reference.layers import reference_hidden_states as layer_reference
from tests.reference.surgery import reference_hidden_states as surgery_reference
from tests.reference.tiny import FAMILIES as ORIGINAL
from tests.reference.tiny import tiny_model
from tests.test_families import TINY, _family, _inputs, _model

#: Not a power of two: every product rounds, so a scale at the wrong place shows.
ALPHA = 0.37


def _reference(name: str, model, alpha: float):
    """A fresh copy of the tiny model with probe's attention choices, scaled by hand."""
    spec = ADAPTERS[_family(model)].spec
    reference = _model(name)
    if spec.float32_softmax:  # probe keeps float64 in the softmax; so does the reference
        reference.config._attn_implementation = register_reference_attention()
    if getattr(reference.config, "_experts_implementation", None) is not None:
        reference.config._experts_implementation = "eager"
    return scaled_copy(reference, alpha), spec


def _assert_equal(got, want, inputs, what: str) -> None:
    assert len(got) == len(want)
    real = inputs.get("attention_mask")
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        keep = torch.ones(g.shape[:2], dtype=torch.bool) if real is None else real.bool()
        assert torch.equal(g[keep], w[keep]), (
            f"{what} layer {layer}: max |diff| {(g[keep] - w[keep]).abs().max():.3g}"
        )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", TINY)
def test_branch_scale_equals_module_surgery_exactly(name, variant):
    model = _model(name)
    padded = model.config.model_type not in ("vit",)
    inputs = _inputs(model, padded)
    probed = probe.wrap(model)
    data = inputs.get("input_ids", inputs.get("pixel_values"))
    mask = inputs.get("attention_mask")
    ablation = replace(PRESETS[variant], branch_scale=ALPHA)
    got = probe.hidden_states(probed, data, ablation, attention_mask=mask)
    scaled, spec = _reference(name, model, ALPHA)
    flags = {"attn_skip": ablation.attn_skip, "mlp": ablation.mlp}
    if name in ORIGINAL:
        want = surgery_reference(scaled, inputs["input_ids"], mask, **flags)
    else:
        call = {**inputs, **{k: v for k, v in spec.forward_kwargs.items() if k == "use_cache"}}
        want = layer_reference(scaled, call, **flags)
    _assert_equal(got, want, inputs, f"{name} {variant}")
    # The scaling changes the stream (alpha is not lost) ...
    plain = probe.hidden_states(probed, data, PRESETS[variant], attention_mask=mask)
    keep = torch.ones(plain[-1].shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    assert not torch.equal(got[-1][keep], plain[-1][keep])
    # ... and leaves the model as it was: the unscaled run after it is a fresh model's.
    again = probe.hidden_states(probed, data, PRESETS[variant], attention_mask=mask)
    assert all(torch.equal(a, b) for a, b in zip(again, plain, strict=True))


@pytest.mark.parametrize("name", TINY)
def test_scaled_transformer_equals_the_models_own_forward(name):
    """The unablated scaled model, run by transformers' own layer code (no hand-written layer)."""
    model = _model(name)
    inputs = _inputs(model, model.config.model_type not in ("vit",))
    probed = probe.wrap(model)
    data = inputs.get("input_ids", inputs.get("pixel_values"))
    mask = inputs.get("attention_mask")
    got = probe.hidden_states(probed, data, Ablation(branch_scale=ALPHA), attention_mask=mask)
    scaled, spec = _reference(name, model, ALPHA)
    call = {**inputs, **{k: v for k, v in spec.forward_kwargs.items() if k == "use_cache"}}
    _assert_equal(got, layer_stream(scaled, call), inputs, name)


def test_alpha_one_is_no_step_at_all():
    """alpha = 1 adds no step: the very same walk as the unscaled model."""
    model = _model("llama")
    inputs = _inputs(model, True)
    probed = probe.wrap(model)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    one = probe.hidden_states(probed, ids, Ablation(branch_scale=1.0), mask)
    plain = probe.hidden_states(probed, ids, TRANSFORMER, mask)
    assert all(torch.equal(a, b) for a, b in zip(one, plain, strict=True))
    assert Ablation(branch_scale=1.0) == TRANSFORMER


@pytest.mark.parametrize("family", ["albert", "xlnet"])
def test_families_outside_the_walker_refuse_branch_scaling(family):
    probed = probe.wrap(tiny_model(family))
    ids = torch.randint(3, 50, (1, 5))
    with pytest.raises(ProbeError, match="branch scaling runs as walker steps") as err:
        probe.hidden_states(probed, ids, Ablation(branch_scale=0.5))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("norm", ["affine", "removed"])
def test_branch_scaling_refuses_the_layernorm_variants(norm):
    with pytest.raises(ProbeError, match="leave LN-affine and no-LN out"):
        Ablation(norm=norm, branch_scale=0.5)


@pytest.mark.parametrize(
    ("text", "depth", "value"),
    [
        ("0.5", 7, 0.5),
        ("1/sqrt(L)", 16, 0.25),
        ("1 / L", 8, 0.125),
        ("L^-0.5", 4, 0.5),
        ("L**-0.5", 4, 0.5),
        ("2/sqrt(2*L)", 8, 0.5),
        ("(L+1)^-1", 3, 0.25),
        ("exp(-log(L))", 5, 1 / 5),
    ],
)
def test_branch_scale_expressions(text, depth, value):
    scale = parse_branch_scale(text)
    assert scale.value(depth) == pytest.approx(value, rel=1e-15)  # one or two roundings
    assert parse_branch_scale(scale.text).value(depth) == scale.value(depth)  # text round trip


def test_branch_scale_text_is_normalised():
    assert parse_branch_scale("1 / sqrt( L )").text == "1/sqrt(L)"
    assert parse_branch_scale("L^-0.5").text == parse_branch_scale("L ** -0.5").text
    assert parse_branch_scale(1).is_one and parse_branch_scale("1.0").is_one
    assert not parse_branch_scale("L/L").is_one  # an expression is a step, even at 1
    assert parse_branch_scale(0.25).text == "0.25"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("abc", "unknown name 'abc'"),
        ("__import__('os')", "not allowed"),
        ("L.real", "not allowed"),
        ("1/", "not an expression"),
        ("0", "finite positive"),
        ("-1", "finite positive"),
        ("-1/L", "finite positive"),
        ("1/(L-L)", "finite positive"),
        ("10^400", "finite positive"),
        ("'a'", "not a number"),
        ("sqrt(L, 2)", "not allowed"),
        ("x" * 200, "give a number"),
        (float("nan"), "finite positive"),
        (float("inf"), "finite positive"),
        (True, "takes a number"),
        ([0.5], "takes a number"),
    ],
)
def test_bad_branch_scales_are_one_line(text, match):
    with pytest.raises(ProbeError, match=match) as err:
        parse_branch_scale(text)
    assert "\n" not in str(err.value)


def test_a_scale_invalid_at_the_models_depth_is_refused():
    scale = parse_branch_scale("1/(L-1)")
    assert scale.value(3) == 0.5
    with pytest.raises(ProbeError, match="at depth L=1"):
        scale.value(1)


def test_the_references_factor_leaves_a_modules_own_alpha_alone():
    """The reference scales a branch module through a class of its own; a module with an
    attribute ``alpha`` of its own (GPT-OSS's experts: their SwiGLU's) keeps it, and the
    output is scaled by the factor, not by that attribute."""
    from tests.reference.branch_scale import _wrap

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.branch = torch.nn.Linear(2, 2, bias=False)
            self.branch.alpha = 7.0  # the module's own number, as an experts block has

    block = Block()
    x = torch.ones(1, 2)
    before = block.branch(x)
    _wrap(block, "branch", 0.5)
    torch.testing.assert_close(block.branch(x), 0.5 * before, rtol=0, atol=0)
    assert block.branch.alpha == 7.0
