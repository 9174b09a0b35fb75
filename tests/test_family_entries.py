"""A family is its one entry: what probe derives from it, and the entry refused when it is made.

* the entry is validated when it is registered: a misspelled layout, style or norm kind,
  a norm no step reads, a missing MLP field each fail in one ProbeError line naming the
  family and what is allowed;
* the theory panel takes the MLP's weights and the query/key norms from the entry;
* OLMo2 (no norm before the attention) and BLOOM (ALiBi, fused query_key_value, the
  residual passed into its attention) are entries like any other; a BLOOM config option
  the entry does not cover is refused naming the option;
* the attention recorded is the one that ran (BLOOM never calls probe's eager attention);
* ``paths --decompose`` refuses a decomposition that does not reconstruct its run;
* a family without its path reference entry fails its own tests, not the collection.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import probe
from probe.analyses.path_decompose import decompose, reconstruction_tolerance
from probe.errors import ProbeError
from probe.measures import theory
from probe.models import ADAPTERS, SpecAdapter
from probe.models.conformance import check_entry
from probe.models.family import GATED_MLP, LAYOUTS, Family, Heads, Mlp, Step, read, zero
from probe.models.weights import resolve_module
from tests.reference.path_families import NoReference, reference_for
from tests.reference.tiny import FAMILIES as ORIGINAL
from tests.reference.tiny import TINY_VARIANTS, tiny_model, tiny_spec_config, tiny_spec_model

SPEC_FAMILIES = sorted(name for name, a in ADAPTERS.items() if isinstance(a, SpecAdapter))
QK_NAMES = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_norm", "key_norm")


def _entry(**changes) -> Family:
    fields = dict(
        name="toy",
        model_types=("toy",),
        layers="layers",
        style="pre",
        steps=(
            zero(":residual_0"),
            read("norm", "input_layernorm", "input"),
            read("probs", "self_attn", index=1),
            read("branch", "self_attn", index=0),
        ),
        norm="input_layernorm",
        norm_kind="rms",
        heads=Heads("self_attn.v_proj", "self_attn.o_proj"),
        skip_means="-",
        mlp_means="-",
        mlp=GATED_MLP,
        mlp_branch="mlp",
    )
    return Family(**{**fields, **changes})


def test_a_valid_entry_is_made():
    assert _entry().name == "toy"
    assert _entry(norm="", steps=_entry().steps[:1] + _entry().steps[2:]).norm == ""


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"heads": Heads("v", "o", layout="fusd")}, "Heads layout 'fusd' is not one of"),
        ({"style": "prenorm"}, "style 'prenorm' is not one of pre, post"),
        ({"norm_kind": "rmsnorm"}, "norm_kind 'rmsnorm' is not one of layernorm"),
        ({"mlp": None}, "mlp is not given"),
        ({"mlp_branch": ""}, "mlp_branch is not given"),
        ({"mlp": Mlp("fc1", "", layout="linear")}, "Mlp needs the paths"),
        ({"mlp": Mlp("fc1", "fc2", layout="conv")}, "Mlp layout 'conv'"),
        ({"norm": "ln_1"}, "norm is 'ln_1' but the step reading 'norm' reads 'input_layernorm'"),
        ({"norm": ""}, r"norm is '' \(no norm before the attention\) but a step reads"),
        ({"branch_norm": "post_attention_layernorm"}, "branch_norm .* sandwich"),
        ({"style": "post", "norm": "", "steps": ()}, "a post-LN family needs its norm"),
        ({"steps": (read("probs", "self_attn", index=1),)}, "no step reads 'branch'"),
        ({"final_norm": "norm", "output": ("project_out",)}, "final_norm 'norm' is not among"),
    ],
)
def test_a_wrong_entry_is_refused_in_one_line_naming_the_family(changes, says):
    with pytest.raises(ProbeError, match=f"^family entry 'toy': {says}") as error:
        _entry(**changes)
    assert "\n" not in str(error.value)


def test_the_layout_error_names_every_allowed_layout():
    with pytest.raises(ProbeError) as error:
        _entry(heads=Heads("v", "o", layout="fused_qkv"))
    assert all(layout in str(error.value) for layout in LAYOUTS)


def test_a_step_that_uses_a_value_before_it_is_read_is_refused():
    from probe.models.family import put

    steps = (put(":hidden_states_0", "branch"), *_entry().steps[1:])
    with pytest.raises(ProbeError, match="uses branch before it is read"):
        _entry(steps=steps)
    with pytest.raises(ProbeError, match="act 'drop' is not one of"):
        Step("mlp", "drop")


def _tiny(name: str):
    return tiny_model(name) if name in ORIGINAL else tiny_spec_model(name)


def _family_of(name: str) -> str:
    return TINY_VARIANTS.get(name, (name,))[0]


#: Every tiny model of a walker family: one per entry and the config branches.
TINY_WALKED = SPEC_FAMILIES + sorted(n for n in TINY_VARIANTS if _family_of(n) in SPEC_FAMILIES)


@pytest.mark.parametrize("name", TINY_WALKED)
def test_the_entry_describes_its_tiny_models_modules(name):
    """Each entry, on its tiny config (and each config branch), passes the check against the
    modules (probe.models.conformance), and names every query/key norm the model has."""
    model = _tiny(name)
    spec = ADAPTERS[_family_of(name)].spec
    check_entry(spec, model)
    layer = model.get_submodule(spec.layers)[0]
    found = {
        path
        for path, module in layer.named_modules()
        if path and path.rsplit(".", 1)[-1] in QK_NAMES and module is not None
    }
    assert found <= set(spec.qk_norms)


@pytest.mark.parametrize("name", [n for n in SPEC_FAMILIES if ADAPTERS[n].spec.qk_norms])
def test_the_query_key_norms_an_entry_names_exist_in_one_of_its_tiny_models(name):
    spec = ADAPTERS[name].spec
    models = [_tiny(n) for n in TINY_WALKED if _family_of(n) == name]
    assert any(
        all(
            resolve_module(model.get_submodule(spec.layers)[0], path, missing_ok=True) is not None
            for path in spec.qk_norms
        )
        for model in models
    )


def test_the_theory_panel_says_the_query_key_norms_and_alibi_from_the_entry():
    olmo2 = theory.layer_constants(probe.wrap(tiny_spec_model("olmo2")))
    assert any("q_norm" in note and "k_norm" in note for note in olmo2["notes"])
    assert all(math.isnan(v) for v in olmo2["lambda"])  # SwiGLU: gated, and said so
    assert any("gated MLP" in line for line in olmo2["missing"])
    bloom = theory.layer_constants(probe.wrap(tiny_spec_model("bloom")))
    assert all(math.isfinite(v) for v in bloom["lambda"])  # a plain GELU MLP, not "gated"
    assert any("ALiBi" in note for note in bloom["notes"])
    assert not any("gated" in line for line in bloom["missing"])


def test_a_bloom_config_the_entry_does_not_cover_is_refused_naming_the_option(tmp_path):
    config = tiny_spec_config("bloom")
    config.apply_residual_connection_post_layernorm = True
    from transformers import BloomModel

    BloomModel(config).save_pretrained(tmp_path / "bloom")
    with pytest.raises(ProbeError, match="apply_residual_connection_post_layernorm") as error:
        probe.load(tmp_path / "bloom", dtype="float64")
    assert "renamed" not in str(error.value)


def test_the_attention_recorded_is_the_one_that_ran(tmp_path, monkeypatch):
    tiny_spec_model("bloom").save_pretrained(tmp_path / "bloom")
    tiny_spec_model("olmo2").save_pretrained(tmp_path / "olmo2")
    # BLOOM's entry claiming a float32 softmax: the config asks for probe_eager, but
    # BloomAttention computes its own softmax and never calls it.
    adapter = ADAPTERS["bloom"]
    monkeypatch.setattr(adapter, "spec", dataclasses.replace(adapter.spec, float32_softmax=True))
    bloom = probe.load(tmp_path / "bloom", dtype="float64")
    assert bloom.config._attn_implementation == "probe_eager"
    probe.hidden_states(bloom, torch.tensor([[3, 4, 5, 6]]))
    assert bloom.attn_implementation == "eager"
    olmo2 = probe.load(tmp_path / "olmo2", dtype="float64")
    probe.hidden_states(olmo2, torch.tensor([[3, 4, 5, 6]]))
    assert olmo2.attn_implementation == "probe_eager"


def test_a_wrong_layout_is_refused_by_the_decomposition(monkeypatch):
    """BLOOM's query_key_value read as blocks [q | k | v] instead of per head: the frozen
    network is not the run, and the decomposition refuses in one line naming the field, by
    the identity probe check prints, before it decomposes anything; the theory panel of a
    collapse run has no constants, for the same reason."""
    adapter = ADAPTERS["bloom"]
    wrong = dataclasses.replace(adapter.spec.heads, layout="fused")
    monkeypatch.setattr(adapter, "spec", dataclasses.replace(adapter.spec, heads=wrong))
    model = tiny_spec_model("bloom")
    says = "entry's heads does not describe this model: path decomposition = the SAN\\+skip run"
    with pytest.raises(ProbeError, match=says):
        decompose(model, init="pretrained", sequences=2, tokens=8, batch_size=2)
    from probe.analyses import collapse

    ds = collapse.run(probe.wrap(model), init="pretrained", sequences=2, tokens=8)
    assert "entry's heads does not describe this model" in ds.attrs["theory_missing"]
    assert np.isnan(ds["beta"]).all()


def test_the_reconstruction_tolerance_is_the_runs_rounding():
    assert reconstruction_tolerance(torch.float64, 3) == 64 * 2.0**-23 * 4  # float32's eps
    assert reconstruction_tolerance(torch.float32, 3) == 64 * 2.0**-23 * 4
    assert reconstruction_tolerance(torch.bfloat16, 24) == 0.25
    assert reconstruction_tolerance(torch.float64, 80) < 0.64 / 100


def test_a_family_without_a_path_reference_fails_only_its_own_lookup():
    with pytest.raises(NoReference, match="no reference entry for model_type 'toy'"):
        reference_for(_Toy())


class _Toy(torch.nn.Module):
    class config:  # noqa: N801 - a stand-in for a transformers config
        model_type = "toy"


def test_a_tied_lm_head_with_a_bias_is_refused_by_the_decomposition():
    """Phi's LM head has a bias, outside the base model: tied to the embeddings, the loss the
    decomposition would compute from the base model leaves the bias out.  probe check's loss
    identity fails on it, and the decomposition, asking the same identity, refuses before it
    decomposes anything, naming the LM head."""
    import transformers

    from tests.reference.tiny import _randomize_

    config = tiny_spec_config("phi")
    config.tie_word_embeddings = True
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(config, attn_implementation="eager")
        _randomize_(model)
    model = model.double().eval()
    says = "entry's logits does not describe this model: .* the LM head has a bias"
    with pytest.raises(ProbeError, match=says):
        decompose(model, init="pretrained", sequences=2, tokens=8, batch_size=2)
