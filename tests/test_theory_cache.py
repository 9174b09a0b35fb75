"""The theory constants are remembered by the weights they are a function of
(probe.measures.theory_cache): a second run on the same weights computes none and gives
the same numbers bit for bit; other weights, a damaged file or an unwritable folder never
give wrong ones."""

from __future__ import annotations

import types

import numpy as np
import pytest

from probe.analyses import collapse
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
