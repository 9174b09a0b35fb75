"""The per-point knobs of a request: config overrides, hub revisions, residual branch scaling.

* ``Model(config=...)`` changes the family's config before a random-init model is built:
  the built model has the fields asked for, every bad key, value or point is one line, and
  results with and without overrides never share a settings id;
* ``Model(revision=...)`` reads a hub id's files at a revision, from a fake local
  HuggingFace cache here (offline); a revision the cache lacks, or one asked of a folder or
  of probe's own checkpoints, is one line;
* ``collapse.run(..., branch_scale=...)`` records alpha and its text, equals the collapse
  metrics of the hand-scaled reference (``tests/reference/branch_scale.py``), and alpha = 1
  leaves a result exactly as it was, settings id included.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import GPT2Config

import probe
from probe import Inputs, Model
from probe.analyses import collapse
from probe.errors import ProbeError
from probe.reports.reproduce import command_line
from probe.requests.overrides import ConfigOverrides, parse_setting, parse_settings
from tests.reference import metrics_numpy
from tests.reference.branch_scale import layer_stream, scaled_copy
from tests.reference.tiny import tiny_model

GPT2_SMALL = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 64, "n_positions": 32}


def _load(name, **config):
    return probe.load(name, init="random", config=config)


# --- config overrides: the value ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("n_layer=4", 4),
        ("n_layer=+4", 4),
        ("initializer_range=0.02", 0.02),
        ("initializer_range=1e-3", 1e-3),
        ("initializer_range=.5", 0.5),
        ("scale_attn_weights=true", True),
        ("scale_attn_weights=False", False),
        ("activation_function=relu", "relu"),
        ("activation_function=gelu_new", "gelu_new"),
        ("name=a=b", "a=b"),
    ],
)
def test_a_setting_is_read_as_a_number_a_bool_or_text(text, value):
    key, got = parse_setting(text)
    assert key == text.split("=")[0] and got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("n_layer", "takes KEY=VALUE"),
        ("=4", "takes KEY=VALUE"),
        ("n_layer=", "has no value"),
        ("n-layer=4", "not a config field name"),
        ("initializer_range=1e999", "finite number"),
        ("initializer_range=nan", None),  # text, not a number: the config's type refuses it
    ],
)
def test_bad_settings_are_one_line(text, match):
    if match is None:
        assert parse_setting(text) == ("initializer_range", "nan")
        return
    with pytest.raises(ProbeError, match=match) as err:
        parse_setting(text)
    assert "\n" not in str(err.value)


def test_overrides_are_frozen_sorted_hashable_and_printable():
    a = ConfigOverrides({"n_layer": 4, "initializer_range": 0.02, "hidden_act": "relu"})
    b = parse_settings(["hidden_act=relu", "n_layer=4", "initializer_range=0.02"])
    assert a == b and hash(a) == hash(b) and a == dict(a)
    assert list(a) == ["hidden_act", "initializer_range", "n_layer"]
    assert str(a) == "hidden_act=relu, initializer_range=0.02, n_layer=4"
    assert json.loads(a.json()) == {"hidden_act": "relu", "initializer_range": 0.02, "n_layer": 4}
    assert parse_settings(a.settings()) == a  # the command line reads its own args back
    with pytest.raises(AttributeError):
        a._items = ()
    with pytest.raises(ProbeError, match="sets n_layer twice"):
        parse_settings(["n_layer=2", "n_layer=3"])
    assert parse_settings([]) is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"init": "pretrained"}, "runs at random init only; use `init` random"),
        ({"init": "both"}, "runs at random init only"),
        ({"init": "random", "config": [("n_layer", 2)]}, "takes a mapping"),
        ({"init": "random", "config": {"n_layer": [2]}}, "only a number, true/false or a text"),
        ({"init": "random", "config": {"n_layer": None}}, "only a number"),
        ({"init": "random", "config": {2: 2}}, "not a config field name"),
        ({"init": "random", "config": {"x": float("inf")}}, "finite number"),
    ],
)
def test_a_request_with_bad_overrides_is_refused_when_built(kwargs, match):
    kwargs = {"config": {"n_layer": 2}} | kwargs
    with pytest.raises(ProbeError, match=match) as err:
        Model("gpt2", **kwargs)
    assert "\n" not in str(err.value)


def test_a_module_takes_no_overrides_and_no_revision():
    model = tiny_model("gpt2")
    with pytest.raises(ProbeError, match="a module is built already"):
        Model(model, init="random", config={"n_layer": 2})
    with pytest.raises(ProbeError, match="a module passed by the caller has none"):
        Model(model, revision="main")
    with pytest.raises(ProbeError, match="go with a model name"):
        probe.load(model, config={"n_layer": 2})


# --- config overrides: the model they build ----------------------------------------------


def test_overrides_build_the_model_they_name():
    probed = _load("gpt2", **GPT2_SMALL, initializer_range=1, activation_function="relu")
    config = probed.config
    assert probed.n_layers == 2 and len(probed.model.h) == 2
    assert probed.model.wte.weight.shape == (64, 32)
    # A float field takes an integer as the float it is; text and numbers as given.
    assert config.initializer_range == 1.0 and type(config.initializer_range) is float
    assert config.activation_function == "relu"
    overrides = json.loads(probed.checkpoint["config_overrides"])
    assert overrides == {**GPT2_SMALL, "initializer_range": 1.0, "activation_function": "relu"}
    assert "with activation_function=relu" in probed.weights
    # The same request without overrides is the bundled GPT-2, untouched.
    assert probe.load("gpt2", init="random", verify=False).config.n_layer == 12


@pytest.mark.parametrize(
    ("name", "config", "layers"),
    [
        (
            "bert-base-uncased",
            {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
             "intermediate_size": 64, "vocab_size": 100},
            1,
        ),
        (
            "meta-llama/Llama-3.2-1B",
            {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
             "vocab_size": 100, "hidden_act": "relu"},
            2,
        ),
        ("fastformer-tiny", {"num_hidden_layers": 1}, 1),
    ],
)  # fmt: skip
def test_overrides_work_for_bundled_and_shipped_configs(name, config, layers):
    probed = _load(name, **config)
    assert probed.n_layers == layers
    for key, value in config.items():
        assert getattr(probed.config, key) == value


def test_overrides_work_for_a_local_folder(tmp_path):
    tiny_model("gpt2").save_pretrained(tmp_path / "m")
    probed = _load(tmp_path / "m", n_layer=1)
    assert probed.n_layers == 1 and probed.config.n_embd == 32


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"n_layr": 2}, "has no key 'n_layr'; did you mean n_layer"),
        ({"return_dict": False}, "has no key 'return_dict'"),  # generic, not the family's
        ({"n_layer": "abc"}, "n_layer=abc: n_layer of the config of gpt2 takes a whole number"),
        ({"n_layer": 2.5}, "takes a whole number, not a real number"),
        ({"n_layer": True}, "takes a whole number, not true/false"),
        ({"scale_attn_weights": 3}, "takes true or false, not a whole number"),
        ({"initializer_range": "x"}, "takes a number, not a text"),
        ({"activation_function": 4}, "takes a text, not a whole number"),
        (
            {"n_head": 5},
            "gpt2 with n_head=5: the config of gpt2: hidden size 768 is not a multiple",
        ),
        ({"n_layer": 0}, "gpt2 with n_layer=0"),
        # Counted from one- and two-layer copies, refused at once (never built).
        ({"n_layer": 10**9}, "gpt2 with n_layer=1000000000: .* needs about 28,351 TB"),
    ],
)
def test_bad_overrides_are_one_line_naming_the_key(config, match):
    with pytest.raises(ProbeError, match=match) as err:
        _load("gpt2", **config)
    assert "\n" not in str(err.value)


def test_a_field_that_is_not_a_scalar_cannot_be_set():
    with pytest.raises(
        ProbeError, match="rope_parameters of the llama config .* cannot be set here"
    ):
        _load("meta-llama/Llama-3.2-1B", rope_parameters="x")


def test_a_point_transformers_cannot_build_names_its_settings(monkeypatch):
    from probe.loading import build

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch\nsecond line")

    monkeypatch.setattr(build, "random_model", broken)
    monkeypatch.setattr(probe.loading, "random_model", broken)
    with pytest.raises(ProbeError, match="gpt2 with n_layer=1: transformers cannot build") as err:
        _load("gpt2", n_layer=1)
    assert "\n" not in str(err.value)


def test_overrides_enter_the_settings_id_and_the_command():
    inputs = Inputs(sequences=2, tokens=8)
    small = Model("gpt2", init="random", config=GPT2_SMALL)
    other = Model("gpt2", init="random", config={**GPT2_SMALL, "initializer_range": 0.5})
    plans = [collapse.prepare(m, inputs, variants="SAN") for m in (small, other)]
    ids = [p.settings for p in plans]
    assert ids[0] != ids[1]
    assert json.loads(ids[0]["config_overrides"]) == GPT2_SMALL
    # The same overrides in another order are the same point.
    again = Model("gpt2", init="random", config=dict(reversed(GPT2_SMALL.items())))
    assert collapse.prepare(again, inputs, variants="SAN").settings == ids[0]
    assert "--set n_embd=32 --set n_head=4 --set n_layer=2" in command_line(
        {"request": plans[0].request}
    )


# --- revisions -----------------------------------------------------------------------


def test_a_revision_loads_the_files_of_that_revision(hub_cache):
    first = probe.load(hub_cache, revision="step1")
    second = probe.load(hub_cache, revision="step2")
    for seed, probed in enumerate((first, second)):
        want = tiny_model("gpt2", seed=seed, dtype=torch.float32).wte.weight
        assert torch.equal(probed.model.wte.weight, want)
        assert probed.checkpoint["revision"] == f"step{seed + 1}"
        # The hub cache holds float64 tensors; the run is float32, and says what was stored.
        assert probed.weights.endswith(f"at revision step{seed + 1}; stored in float64")
    inputs = Inputs(sequences=1, tokens=6)
    settings = [
        collapse.prepare(Model(hub_cache, init="pretrained", revision=r), inputs).settings
        for r in ("step1", "step2")
    ]
    assert settings[0]["revision"] == "step1" and settings[0] != settings[1]
    command = collapse.prepare(Model(hub_cache, init="pretrained", revision="step1"), inputs)
    assert "--revision step1" in command_line({"request": command.request})


def test_a_revision_the_cache_lacks_cannot_be_had_offline(hub_cache):
    with pytest.raises(ProbeError, match="at revision 'step3'.*cannot be had offline") as err:
        probe.load(hub_cache, revision="step3")
    assert "\n" not in str(err.value)


def test_a_revision_is_refused_for_folders_and_probes_own(tmp_path):
    tiny_model("gpt2").save_pretrained(tmp_path / "m")
    with pytest.raises(ProbeError, match="is a local folder, not a hub id"):
        probe.load(tmp_path / "m", revision="main")
    for name in ("gpt2-tiny", "minilm"):
        with pytest.raises(ProbeError, match="probe's own checkpoint, not a hub id"):
            probe.load(name, revision="main")


@pytest.mark.parametrize("revision", ["", " ", "a b", "x" * 300, 3])
def test_bad_revisions_are_one_line(revision):
    with pytest.raises(ProbeError, match="`revision`"):
        Model("gpt2", revision=revision)


def test_a_remote_model_takes_no_revision():
    with pytest.raises(ProbeError, match="drop `revision`"):
        Model("gpt2", init="pretrained", remote=True, revision="main")


# --- branch scaling in a collapse run ----------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bs") / "gpt2"
    tiny_model("gpt2", seed=3).save_pretrained(folder)
    return folder


def _ids():
    return torch.randint(3, 80, (3, 7), generator=torch.Generator().manual_seed(4))


def test_collapse_with_branch_scale_equals_the_scaled_reference(gpt2_folder):
    model = Model(gpt2_folder, init="pretrained", dtype="float64")
    ds = collapse.run(model, Inputs(ids=_ids()), variants="transformer", branch_scale="1/sqrt(L)")
    alpha = 1 / np.sqrt(2)  # two layers
    assert ds.attrs["branch_scale"] == "1/sqrt(L)" and ds.attrs["branch_scale_value"] == alpha
    reference = scaled_copy(tiny_model("gpt2", seed=3, dtype=torch.float64), alpha)
    stream = layer_stream(reference, {"input_ids": _ids()})
    got = ds["relative_residual"].sel(variant="transformer", init="pretrained", fit="mean",
                                      norm="l1inf")  # fmt: skip
    for layer, x in enumerate(stream):
        want = metrics_numpy.relative_residual(x.numpy())
        # float64 metrics by other operations than numpy's: a few roundings apart.
        np.testing.assert_allclose(got.sel(layer=layer).values, want, rtol=1e-12)
    assert "no theory panel with the residual branches scaled" in ds.attrs["theory_missing"]
    assert "--branch-scale '1/sqrt(L)'" in command_line(ds.attrs)  # shell-quoted


def test_branch_scale_one_changes_nothing(gpt2_folder):
    model = Model(gpt2_folder, init="pretrained", dtype="float64")
    plain = collapse.run(model, Inputs(ids=_ids()), variants="SAN,transformer")
    for one in (1, 1.0, "1", " 1.0 "):
        again = collapse.run(model, Inputs(ids=_ids()), variants="SAN,transformer",
                             branch_scale=one)  # fmt: skip
        assert again.attrs["settings_id"] == plain.attrs["settings_id"]
        for name in plain.data_vars:
            np.testing.assert_array_equal(again[name].values, plain[name].values)
    assert plain.attrs["branch_scale"] == "1" and plain.attrs["branch_scale_value"] == 1.0


def test_branch_scales_give_their_own_settings_ids(gpt2_folder):
    model = Model(gpt2_folder, init="pretrained")
    ids = {
        collapse.prepare(model, Inputs(sequences=1, tokens=6), branch_scale=s).settings.get(
            "branch_scale"
        )
        for s in ("0.5", "1/sqrt(L)", "1/L", 1)
    }
    assert ids == {"0.5", "1/sqrt(L)", "1/L", None}


def test_a_scale_invalid_at_the_depth_is_refused_before_any_work(gpt2_folder):
    model = Model(gpt2_folder, init="pretrained")
    with pytest.raises(ProbeError, match="at depth L=2"):
        collapse.prepare(model, Inputs(sequences=1, tokens=6), branch_scale="1/(L-2)")


def test_gpt2_config_is_what_the_overrides_check_against():
    """The keys the tests above use are GPT-2's own fields (a renamed field fails here)."""
    fields = set(GPT2Config().to_dict())
    assert {"n_layer", "n_embd", "n_head", "initializer_range", "scale_attn_weights"} <= fields


def test_attention_with_branch_scale_equals_the_scaled_module(gpt2_folder, monkeypatch):
    """probe attention of the model with its branches scaled by the walker equals probe
    attention of the hand-scaled copy (tests/reference/branch_scale.py), run as it is.

    The copy's MLP computes alpha times GPT-2's, so the entry's check of what its MLP
    computes (probe.models.conformance) rightly refuses it as a GPT-2: that one check is
    left out for the copy; the self-test's identities still run on it."""
    from probe.analyses import attention

    monkeypatch.setattr("probe.models.conformance._mlp_function", lambda *args: None)

    model = Model(gpt2_folder, init="pretrained", dtype="float64")
    got = attention.run(model, Inputs(ids=_ids()), branch_scale=0.37)
    reference = scaled_copy(tiny_model("gpt2", seed=3, dtype=torch.float64), 0.37)
    want = attention.run(Model(reference, init="pretrained"), Inputs(ids=_ids()))
    plain = attention.run(model, Inputs(ids=_ids()))
    for name in want.data_vars:
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)
    assert not np.array_equal(got["anisotropy"].values, plain["anisotropy"].values)
    assert got.attrs["branch_scale"] == "0.37" and got.attrs["branch_scale_value"] == 0.37
    assert json.loads(got.attrs["settings"]) == {"epsilon": 0.3, "branch_scale": "0.37"}
    assert json.loads(plain.attrs["settings"]) == {"epsilon": 0.3}
    assert (
        "branch_scale" not in plain.attrs
    )  # an unscaled result's attributes (and file name) lack it
    assert "--branch-scale 0.37" in command_line(got.attrs)


def test_collapse_removal_variants_take_the_branch_scale(gpt2_folder):
    """no-sink and no-massive remove what the scaled transformer's clean run finds."""
    model = Model(gpt2_folder, init="pretrained", dtype="float64")
    inputs = Inputs(ids=_ids())
    ds = collapse.run(model, inputs, variants="transformer,no-massive", branch_scale=0.37)
    plain = collapse.run(model, inputs, variants="transformer,no-massive")
    assert "no-massive" in ds.attrs["removal_note"]
    scaled = ds["relative_residual"].sel(variant="transformer")
    assert not np.array_equal(scaled.values, plain["relative_residual"].sel(variant="transformer"))


def test_the_command_line_writes_one_file_per_point(tmp_path):
    """--set and --branch-scale enter the settings id: each point gets its own file, and a
    rerun of a point replaces its own."""
    import xarray as xr
    from typer.testing import CliRunner

    from probe.cli.app import app

    base = ["collapse", "gpt2", "--init", "random", "--variants", "SAN", "--sequences", "1"]
    base += ["--tokens", "6", "--out", str(tmp_path), "--quiet"]
    small = [a for k, v in GPT2_SMALL.items() for a in ("--set", f"{k}={v}")]
    points = [
        small,
        [*small, "--branch-scale", "1/sqrt(L)"],
        [*small, "--set", "initializer_range=0.5"],
    ]
    for extra in [*points, points[1]]:
        result = CliRunner().invoke(app, [*base, *extra])
        assert result.exit_code == 0, result.output
    files = sorted(tmp_path.glob("collapse-*.nc"))
    assert len(files) == 3
    found = []
    for path in files:
        with xr.open_dataset(path) as ds:
            found.append((json.loads(ds.attrs["config_overrides"]), ds.attrs["branch_scale"]))
    assert sorted(found, key=str) == sorted(
        [
            (GPT2_SMALL, "1"),
            (GPT2_SMALL, "1/sqrt(L)"),
            ({**GPT2_SMALL, "initializer_range": 0.5}, "1"),
        ],
        key=str,
    )
