"""probe.requests.request: the one request (Model, Inputs) every analysis takes, checked when built."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import probe
from cli.console import in_cli_words
from probe.analyses import collapse, paths
from probe.errors import ProbeError
from probe.reports.reproduce import command_line
from probe.requests.request import Inputs, Model, coerce, parse_inits, provenance, record

SMALL = {"sequences": 3, "tokens": 6, "batch_size": 2}


# --- checked once, when built ---------------------------------------------------------


def test_model_normalises_what_it_is_given():
    model = Model("gpt2", init="both", seed="7", dtype=torch.float64, device="cpu")
    assert model.init == ("pretrained", "random")
    assert model.seed == 7 and model.dtype == "float64" and model.device == "cpu"
    assert Model("gpt2", init=["random", "pretrained"]).init == ("pretrained", "random")
    assert Model("gpt2", init="random").init == ("random",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"init": "trained"}, "unknown init 'trained'; choose pretrained, random or both"),
        ({"seed": -1}, "`seed` must be a whole number from 0 to 9223372036854775807, got -1"),
        ({"dtype": "float8"}, "unknown dtype 'float8'"),
        ({"device": "tpu"}, "unknown device 'tpu' for `device`"),
        ({"device_map": "everywhere"}, "unknown device map 'everywhere'"),
        ({"max_memory": {"cpu": "1GiB"}}, "`max_memory` and `offload_folder` go with `device_map`"),
        ({"remote": True, "init": "random"}, "`remote` runs pretrained weights only"),
        ({"remote": "yes"}, "`remote` is True, False or 'local'"),
    ],
)
def test_model_refuses_in_one_line(kwargs, message):
    with pytest.raises(ProbeError) as caught:
        Model("gpt2", **kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_model_refuses_a_source_that_is_no_model():
    with pytest.raises(ProbeError, match="`source` is empty"):
        Model("  ")
    with pytest.raises(ProbeError, match="got int"):
        Model(3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": 1}, "`tokens` must be a whole number from 2 to"),
        ({"sequences": 0}, "`sequences` must be a whole number from 1 to"),
        ({"batch_size": "many"}, "`batch_size` must be a whole number from 1 to"),
        ({"sequences": "all"}, "`sequences` 'all' needs `text` or `images`"),
        ({"text": "no-such-file.txt"}, "no such text file"),
        ({"ids": torch.zeros(3, dtype=torch.long)}, "`ids` must be a (sequence, token) tensor"),
        ({"ids": torch.zeros(2, 4, dtype=torch.long), "tokens": 5}, "come from the shape"),
    ],
)
def test_inputs_refuse_in_one_line(kwargs, message):
    with pytest.raises(ProbeError) as caught:
        Inputs(**kwargs)
    assert message in str(caught.value)


def test_inputs_take_their_sizes_from_given_ids():
    given = Inputs(ids=torch.zeros(4, 9, dtype=torch.long))
    assert (given.sequences, given.tokens, given.batch_size) == (4, 9, None)
    assert given.with_defaults(sequences=32, tokens=128, batch_size=16).batch_size == 16
    assert given.with_defaults(sequences=32).sequences == 4  # what was given stays


def test_a_request_is_frozen():
    with pytest.raises(AttributeError):
        Model("gpt2").seed = 3
    with pytest.raises(AttributeError):
        Inputs().tokens = 3


# --- the flat keywords and the two values are one request ---------------------------------


def test_coerce_splits_the_flat_keywords():
    model, inputs = coerce("gpt2", None, {"init": "random", "seed": 4, "tokens": 9})
    assert model == Model("gpt2", init="random", seed=4)
    assert inputs == Inputs(tokens=9)
    with pytest.raises(ProbeError, match="give `seed` in the Model"):
        coerce(Model("gpt2"), None, {"seed": 4})
    with pytest.raises(ProbeError, match="give `tokens` in the Inputs"):
        coerce("gpt2", Inputs(), {"tokens": 4})
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        coerce("gpt2", None, {"colour": 1})


def test_collapse_gives_the_same_numbers_either_way(tiny_folders):
    flat = collapse.run(tiny_folders["gpt2"], init="random", seed=2, variants="SAN", **SMALL)
    request = collapse.run(
        Model(tiny_folders["gpt2"], init="random", seed=2), Inputs(**SMALL), variants="SAN"
    )
    assert flat.relative_residual.equals(request.relative_residual)
    assert flat.attrs["settings_id"] == request.attrs["settings_id"]
    assert flat.attrs["request"] == request.attrs["request"]


def test_paths_take_the_same_request(tiny_folders):
    model = Model(tiny_folders["gpt2"], init="random", seed=1, dtype="float64")
    given = Inputs(sequences=2, tokens=5, batch_size=1)
    flat = paths.decompose(tiny_folders["gpt2"], init="random", seed=1, sequences=2, tokens=5,
                           batch_size=1)  # fmt: skip
    assert paths.decompose(model, given).share.equals(flat.share)
    sampled = paths.sample(model, given, samples=3)
    assert sampled.attrs["sequences"] == 2 and sampled.attrs["dtype"] == "float64"


def test_passed_ids_are_read_as_they_are(tiny_folders):
    ids = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])
    ds = collapse.run(Model(tiny_folders["gpt2"], init="random"), Inputs(ids=ids), variants="SAN")
    assert ds.sizes["sequence"] == 2 and ds.attrs["tokens"] == 5
    assert ds.attrs["inputs"] == "ids passed by the caller"
    with pytest.raises(ProbeError, match=r"`ids` must lie in \[0, "):
        collapse.run(Model(tiny_folders["gpt2"], init="random"), Inputs(ids=ids * 10**6))


def test_a_module_runs_once_under_its_own_weights():
    from tests.reference.tiny import tiny_model

    module = tiny_model("gpt2")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    ds = collapse.run(module, variants="SAN", **SMALL)  # init "both": the module's own weights
    assert list(ds.init.values) == ["pretrained"]
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_a_loaded_model_is_converted_where_asked(tiny_folders):
    probed = probe.load(tiny_folders["gpt2"], init="random")
    ds = collapse.run(probed, init="random", dtype="float64", variants="SAN", **SMALL)
    assert ds.attrs["dtype"] == "float64" and probed.dtype == torch.float32


# --- provenance and the reproduce line ------------------------------------------------


def test_provenance_is_derived_once(tiny_folders):
    from probe.requests.inputs import model_inputs

    models = Model(tiny_folders["bert"], init="random", seed=5).load()
    encoded = model_inputs(models[0], Inputs(sequences=2, tokens=4), seed=5)
    attrs = provenance(models, encoded)
    assert attrs["seed"] == 5 and attrs["sequences"] == 2 and attrs["tokens"] == 4
    assert attrs["dtype"] == "float32" and attrs["family"] == "bert"
    assert attrs["weights"].startswith("random: random init (seed 5)")
    assert attrs["precision_floor"] == 10 * 2.0**-23  # 10 float32 epsilons
    assert all(isinstance(v, str | int | float) for v in attrs.values())


def test_a_recorded_request_renders_the_command_line():
    recorded = record(
        "collapse", Model("gpt2", init="random", seed=3), Inputs(tokens=9), {"variants": "SAN"},
        dtype="float32", sequences=4,
    )  # fmt: skip
    assert json.loads(recorded)["model"] == {"source": "gpt2", "init": "random", "seed": 3,
                                             "dtype": "float32"}  # fmt: skip
    line = command_line({"request": recorded})
    assert line == (
        "probe collapse gpt2 --init random --variants SAN --seed 3 --dtype float32 "
        "--sequences 4 --tokens 9"
    )


# --- the library names parameters; the command line its flags --------------------------


def test_the_cli_shows_its_flags_for_the_library_parameters():
    assert in_cli_words("`batch_size` must be at least 1") == "--batch-size must be at least 1"
    assert in_cli_words("use `device` or `device_map`") == "use --device or --device-map"
    assert in_cli_words("see `probe paths --help`") == "see `probe paths --help`"


@given(st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True))
def test_every_parameter_becomes_its_flag(name):
    expected = {"source": "MODEL", "ids": "token ids"}.get(name, "--" + name.replace("_", "-"))
    assert in_cli_words(f"x `{name}` y") == f"x {expected} y"


def test_parse_inits_keeps_probe_order():
    assert parse_inits("both") == ("pretrained", "random")
    assert parse_inits(("random",)) == ("random",)
    with pytest.raises(ProbeError):
        parse_inits([])


def test_a_spread_model_is_neither_moved_nor_converted(tiny_folders):
    spread = probe.load(tiny_folders["gpt2"], init="random", device_map="sequential")
    assert Model(spread, init="random").load() == [spread]  # as it is: no copy
    with pytest.raises(ProbeError) as caught:
        Model(spread, init="random", dtype="float64").load()
    assert "pass device=None and dtype='float32'" in str(caught.value)


def test_defaults_fill_the_inputs_without_reading_the_text_again(tmp_path, monkeypatch):
    import probe.requests.inputs

    path = tmp_path / "t.txt"
    path.write_text("some words to read " * 20, encoding="utf-8")
    reads = []
    original = probe.requests.inputs.read_text
    monkeypatch.setattr(
        probe.requests.inputs, "read_text", lambda p: reads.append(p) or original(p)
    )
    given = Inputs(text=path, tokens=9)
    filled = given.with_defaults(sequences=32, tokens=128, batch_size=16)
    assert (filled.sequences, filled.tokens, filled.batch_size) == (32, 9, 16)
    assert (given.sequences, given.batch_size) == (None, None)  # the original is untouched
    assert reads == [path]  # read once, when the request was built
