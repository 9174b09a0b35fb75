"""The theory constants are remembered by the weights they are a function of
(probe.measures.theory_cache): a second run on the same weights computes none and gives
the same numbers bit for bit; other weights, a damaged file or an unwritable folder never
give wrong ones."""

from __future__ import annotations

import types

import numpy as np
import pytest

from probe.analyses import collapse
from probe.errors import ProbeWarning
from probe.measures import theory, theory_cache

OPTIONS = dict(init="random", sequences=2, tokens=8, variants="SAN,SAN+MLP")


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """A fresh cache folder, and how many times the constants were computed."""
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = theory.layer_constants

    def counting(probed):
        calls.append(probed.name)
        return real(probed)

    monkeypatch.setattr(theory, "layer_constants", counting)
    return calls


def _same(a, b):
    assert list(a.data_vars) == list(b.data_vars)
    for name in a.data_vars:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    for name in ("theory_missing", "theory_notes"):
        assert a.attrs[name] == b.attrs[name]


def test_a_second_run_on_the_same_weights_computes_no_constants(counted, tiny_folders):
    first = collapse.run(tiny_folders["gpt2"], **OPTIONS)
    assert len(counted) == 1
    again = collapse.run(tiny_folders["gpt2"], **OPTIONS)
    assert len(counted) == 1  # read back, not computed
    _same(first, again)
    assert np.isfinite(again["beta"].values[..., 1:]).all()  # the constants are there
    other = collapse.run(tiny_folders["gpt2"], seed=1, **OPTIONS)  # other random weights
    assert len(counted) == 2
    assert not np.array_equal(other["beta"].values, first["beta"].values)


def test_a_damaged_or_unwritable_cache_gives_the_computed_constants(
    counted, tiny_folders, tmp_path, monkeypatch
):
    fresh = collapse.run(tiny_folders["gpt2"], **OPTIONS)
    (kept,) = (tmp_path / "cache" / "theory").glob("*.json")
    kept.write_text("{not json")
    _same(collapse.run(tiny_folders["gpt2"], **OPTIONS), fresh)
    assert len(counted) == 2  # computed again, and kept again
    assert kept.read_text().startswith("{")
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("PROBE_CACHE_DIR", str(blocked))  # no folder can be made here
    _same(collapse.run(tiny_folders["gpt2"], **OPTIONS), fresh)
    _same(collapse.run(tiny_folders["gpt2"], **OPTIONS), fresh)
    assert len(counted) == 4  # computed every time


MALFORMED = {
    "an empty object": "{}",
    "a list": "[1, 2]",
    "constants without missing": '{"beta": [1.0, 1.0]}',
    "a NaN constant": None,  # the kept entry, one beta set to NaN
    "a short list": None,  # the kept entry, one layer's qk dropped
    "a string for a number": None,  # the kept entry, heads as text
    "a negative constant": None,  # the kept entry, c[0] below 0
    "missing not a list": '{"missing": "beta"}',
}


def _spoilt(kept: dict, case: str) -> str:
    import json

    entry = json.loads(json.dumps(kept))
    if case == "a NaN constant":
        entry["beta"][0] = float("nan")
    elif case == "a short list":
        entry["qk"] = entry["qk"][1:]
    elif case == "a string for a number":
        entry["heads"] = str(entry["heads"])
    elif case == "a negative constant":
        entry["c"][0] = -1.0
    return json.dumps(entry)


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_cache_entry_is_recomputed_replaced_and_said(
    case, counted, tiny_folders, tmp_path
):
    """An entry that parses but is not what constants are is never trusted: the run
    computes the constants again (the fresh run's bit for bit), replaces the entry, and
    says so once, as a probe warning naming the entry."""
    import json

    fresh = collapse.run(tiny_folders["gpt2"], **OPTIONS)
    (kept,) = (tmp_path / "cache" / "theory").glob("*.json")
    good = kept.read_text()
    kept.write_text(MALFORMED[case] or _spoilt(json.loads(good), case))
    with pytest.warns(ProbeWarning, match="malformed") as said:
        again = collapse.run(tiny_folders["gpt2"], **OPTIONS)
    assert len(said) == 1 and str(kept) in str(said[0].message)
    _same(again, fresh)
    assert len(counted) == 2  # computed again
    assert kept.read_text() == good  # and the entry replaced by what was computed
    collapse.run(tiny_folders["gpt2"], **OPTIONS)
    assert len(counted) == 2  # read back from then on


def test_a_malformed_cache_entry_is_one_warning_line_on_the_command_line(tiny_folders, tmp_path):
    from typer.testing import CliRunner

    from probe.cli.app import app

    env = {"PROBE_CACHE_DIR": str(tmp_path / "cache")}
    args = ["collapse", tiny_folders["gpt2"], "--init", "random", "--sequences", "2",
            "--tokens", "8", "--variants", "SAN", "--out", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    first = CliRunner().invoke(app, args, env=env)
    assert first.exit_code == 0, first.output
    (kept,) = (tmp_path / "cache" / "theory").glob("*.json")
    kept.write_text("{}")
    second = CliRunner().invoke(app, args, env=env)
    assert second.exit_code == 0, second.output
    lines = [line for line in second.stderr.splitlines() if "malformed" in line]
    assert len(lines) == 1 and lines[0].startswith("probe: warning: the cached theory constants")
    assert "Traceback" not in second.output


def test_pretrained_weights_that_nothing_identifies_are_not_kept():
    # a hub checkpoint read without a revision: its files may change under the same name
    hub = types.SimpleNamespace(
        checkpoint={}, init="pretrained", seed=0, weights="pretrained", name="org/model"
    )
    assert theory_cache.weights_identity(hub) is None
    with_revision = types.SimpleNamespace(
        **{**vars(hub), "checkpoint": {"checkpoint_revision": "abc"}}
    )
    assert theory_cache.weights_identity(with_revision)["checkpoint"] == {
        "checkpoint_revision": "abc"
    }
    shipped = types.SimpleNamespace(**{**vars(hub), "name": "gpt2-tiny"})
    assert theory_cache.weights_identity(shipped) is not None
