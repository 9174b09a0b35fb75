"""Every family the generic walker runs, on its tiny config, in float64.

Found from the registry (``probe.models.ADAPTERS``), so a new family is tested as
soon as it has its entry and its tiny config:

* the self-test identities (``probe.surgery.self_test``) hold exactly: the clean run equals HF's
  ``hidden_states``, SAN equals the attention branch, SAN+skip equals x + branch
  (N(...) post-LN), and the model is left as it was;
* the hooks equal an independent module surgery (``tests/reference/layers.py``,
  ``tests/reference/surgery.py``) to the bit, for the four variants, with padding;
* ``probe.wrap`` of a user's own model (sdpa attention, training mode) works and
  leaves that model exactly as it was;
* ``probe_eager`` is HF's eager attention bitwise in float32, and keeps float64.
"""

from __future__ import annotations

import pytest
import torch

import probe
from probe.models import ADAPTERS, SpecAdapter
from probe.surgery.ablate import PRESETS, SAN, VARIANTS
from probe.surgery.core_check import CORE
from probe.surgery.self_test import identities
from tests.reference.attention import register as register_reference_attention
from tests.reference.layers import reference_hidden_states as layer_reference
from tests.reference.surgery import reference_hidden_states as surgery_reference
from tests.reference.tiny import (
    FAMILIES as ORIGINAL,
)
from tests.reference.tiny import (
    TINY_CONFIGS,
    TINY_VARIANTS,
    tiny_model,
    tiny_spec_model,
)

SPEC_FAMILIES = sorted(name for name, a in ADAPTERS.items() if isinstance(a, SpecAdapter))
#: Every tiny model: one per family, plus the config branches (post-LN OPT, ...).
TINY = SPEC_FAMILIES + sorted(TINY_VARIANTS)


def _model(name: str, dtype=torch.float64, attn: str = "eager") -> torch.nn.Module:
    if name in ORIGINAL:
        model = tiny_model(name, seed=1, dtype=dtype)
        model.config._attn_implementation = attn
        return model
    return tiny_spec_model(name, seed=1, dtype=dtype, attn=attn)


def _inputs(model, padded: bool) -> dict:
    config = model.config
    generator = torch.Generator().manual_seed(5)
    if config.model_type == "vit":
        size = config.image_size
        pixels = torch.randn(2, config.num_channels, size, size, generator=generator)
        return {"pixel_values": pixels.to(next(model.parameters()).dtype)}
    ids = torch.randint(3, config.vocab_size, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    if padded:
        mask[-1, 6:] = 0
        mask[-2, 8:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_every_walker_family_has_a_tiny_config_and_a_reference():
    from tests.reference.layers import layer_implementation

    assert set(SPEC_FAMILIES) == (set(TINY_CONFIGS) | {"bert", "gpt2"})
    for name in SPEC_FAMILIES:
        model = _model(name)
        assert model.config.model_type in ADAPTERS[name].model_types
        assert name in ORIGINAL or layer_implementation(model)


@pytest.mark.parametrize("name", TINY)
def test_the_self_test_identities_hold_exactly(name, tmp_path):
    folder = tmp_path / name
    _model(name).save_pretrained(folder)
    probed = probe.load(folder, dtype="float64")
    found = identities(probed)
    names = [identity.name.split(" = ")[0] for identity in found]
    mlp = [] if probed.adapter.style(probed.config) == "post" else ["MLP branch x alpha at"]
    mlp = [f"{mlp[0]} {probed.adapter.spec.mlp_branch_of(probed.config)}"] if mlp else []

    def anchor(norm):  # pre-LN, an MLP branch torch hooks reach: layer 1 against them
        module = mlp and not probed.adapter.spec.mlp_branch_of(probed.config).startswith(":")
        return [f"SAN+skip/{norm} at layer 1"] if module else []

    assert names == [
        "entry",
        "clean run",
        "SAN",
        "SAN+skip",
        *mlp,
        *(
            row
            for norm in ("LN-affine", "no-LN")
            for row in (norm, f"SAN/{norm}", f"SAN+skip/{norm}", *anchor(norm))
        ),
        "probe's attention",
        "clean run after ablated runs",
    ]
    eps = torch.finfo(torch.float64).eps
    for identity in found:
        assert identity.error == "", identity
        if identity.name == CORE:
            # probe's float64 core against the model's own function, whose softmax may run
            # in float32: each probability within 2^-24 of the float64 one (core_check).
            assert identity.holds() and identity.max_diff <= identity.bound, identity
        elif identity.name.startswith("MLP branch"):
            # y(2) - y(0) against 2 (y(1) - y(0)): each of y(1), y(2) is one rounded sum, so
            # at most 4 units of float64 rounding of the values' size apart.
            assert identity.max_diff <= 4 * eps * identity.scale, identity
        else:
            # float64 on the CPU: both sides run the very same operations, so exactly 0.
            assert identity.max_diff == 0.0, identity


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", TINY)
def test_hooks_equal_reference_surgery_exactly(name, variant):
    model = _model(name)
    spec = ADAPTERS[_family(model)].spec
    ablation = PRESETS[variant]
    padded = model.config.model_type not in ("vit",)
    inputs = _inputs(model, padded)
    probed = probe.wrap(model)
    data = inputs.get("input_ids", inputs.get("pixel_values"))
    got = probe.hidden_states(probed, data, ablation, attention_mask=inputs.get("attention_mask"))
    if name in ORIGINAL:
        want = surgery_reference(
            model,
            inputs["input_ids"],
            inputs["attention_mask"],
            attn_skip=ablation.attn_skip,
            mlp=ablation.mlp,
        )
    else:
        reference = _model(name)
        if spec.float32_softmax:  # probe keeps float64 in the softmax; so does the reference
            reference.config._attn_implementation = register_reference_attention()
        if getattr(reference.config, "_experts_implementation", None) is not None:
            reference.config._experts_implementation = "eager"  # experts one by one in float64
        # The same one-shot forward (no key/value cache) that probe makes.
        call = {**inputs, **{k: v for k, v in spec.forward_kwargs.items() if k == "use_cache"}}
        want = layer_reference(reference, call, attn_skip=ablation.attn_skip, mlp=ablation.mlp)
    assert len(got) == len(want)
    real = inputs.get("attention_mask")
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        keep = torch.ones(g.shape[:2], dtype=torch.bool) if real is None else real.bool()
        assert torch.equal(g[keep], w[keep]), (
            f"{name} {variant} layer {layer}: max |diff| {(g[keep] - w[keep]).abs().max():.3g}"
        )


def _family(model) -> str:
    return next(n for n, a in ADAPTERS.items() if model.config.model_type in a.model_types)


@pytest.mark.parametrize("name", SPEC_FAMILIES)
def test_wrap_takes_a_users_model_as_it_is_and_leaves_it_so(name):
    try:
        model = _model(name, dtype=torch.float32, attn="sdpa")
    except ValueError:  # a family without sdpa: the user's model has its default attention
        model = _model(name, dtype=torch.float32)
    attn = model.config._attn_implementation
    model.train()  # a user's model, mid-experiment
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probed = probe.wrap(model)
    inputs = _inputs(model, padded=False)
    data = inputs.get("input_ids", inputs.get("pixel_values"))
    clean = probe.hidden_states(probed, data)
    probe.hidden_states(probed, data, SAN)
    assert all(
        torch.equal(a, b) for a, b in zip(clean, probe.hidden_states(probed, data), strict=True)
    )
    assert model.training and model.config._attn_implementation == attn
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any("forward" in m.__dict__ for m in model.modules())


FLOAT32_SOFTMAX = [n for n in SPEC_FAMILIES if ADAPTERS[n].spec.float32_softmax]


@pytest.mark.parametrize("name", FLOAT32_SOFTMAX)
def test_probe_eager_is_hf_eager_bitwise_in_float32(name):
    from probe.models.attention import register

    model = _model(name, dtype=torch.float32)
    inputs = _inputs(model, padded=model.config.model_type != "vit")
    with torch.no_grad():
        want = model(**inputs, output_hidden_states=True).hidden_states
        model.config._attn_implementation = register()
        got = model(**inputs, output_hidden_states=True).hidden_states
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_float64_run_uses_probe_eager_and_a_float32_run_hf_eager(tmp_path):
    _model("llama").save_pretrained(tmp_path / "llama")
    assert probe.load(tmp_path / "llama", dtype="float64").attn_implementation == "probe_eager"
    assert probe.load(tmp_path / "llama", dtype="float32").attn_implementation == "eager"
