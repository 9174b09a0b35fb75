"""The result file: atomic writes and save/open round trips."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import probe
from probe.files.results import check_schema, netcdf_safe, save_result, write_text_atomic
from tests.datasets import make_collapse_dataset

finite_or_nan = st.floats(allow_infinity=False, width=64)
attr_values = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    st.integers(-(2**31), 2**31 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)


@st.composite
def datasets(draw):
    variants = draw(st.lists(st.sampled_from(probe.VARIANTS), min_size=1, max_size=4, unique=True))
    inits = draw(
        st.lists(st.sampled_from(["pretrained", "random"]), min_size=1, max_size=2, unique=True)
    )
    layers, sequences = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    shape = (len(variants), len(inits), layers, sequences)
    values = draw(arrays(np.float64, shape, elements=finite_or_nan))
    attrs = draw(
        st.dictionaries(
            st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True), attr_values, max_size=5
        )
    )
    ds = xr.Dataset(
        {"effective_rank": (("variant", "init", "layer", "sequence"), values)},
        coords={
            "variant": variants,
            "init": inits,
            "layer": np.arange(layers),
            "sequence": np.arange(sequences),
        },
        attrs={**attrs, "analysis": "collapse"},
    )
    return ds


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ds=datasets())
def test_save_open_round_trip(tmp_path, ds):
    path = save_result(ds, tmp_path / "r.nc")
    back = probe.open_result(path)
    xr.testing.assert_identical(back, ds)


def test_write_is_atomic_when_it_fails(tmp_path, monkeypatch):
    ds = xr.Dataset({"x": ("layer", [1.0, 2.0])}, attrs={"analysis": "collapse"})

    def broken(self, path=None, **kwargs):  # the file is built in memory (path None) now
        if path is not None:
            with open(path, "wb") as handle:
                handle.write(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(xr.Dataset, "to_netcdf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        save_result(ds, tmp_path / "r.nc")
    assert os.listdir(tmp_path) == []


def test_overwrite_replaces_whole_file(tmp_path):
    first = xr.Dataset({"x": ("layer", [1.0])}, attrs={"analysis": "collapse"})
    second = xr.Dataset({"x": ("layer", [2.0, 3.0])}, attrs={"analysis": "collapse"})
    save_result(first, tmp_path / "r.nc")
    save_result(second, tmp_path / "r.nc")
    xr.testing.assert_identical(probe.open_result(tmp_path / "r.nc"), second)
    assert sorted(os.listdir(tmp_path)) == ["r.nc"]


def test_open_errors(tmp_path):
    with pytest.raises(probe.ProbeError, match="no such result file"):
        probe.open_result(tmp_path / "missing.nc")
    (tmp_path / "junk.nc").write_text("not netcdf")
    with pytest.raises(probe.ProbeError, match="is not a probe result"):
        probe.open_result(tmp_path / "junk.nc")
    xr.Dataset({"x": ("a", [1.0])}).to_netcdf(tmp_path / "other.nc", engine="h5netcdf")
    with pytest.raises(probe.ProbeError, match="no 'analysis' attribute"):
        probe.open_result(tmp_path / "other.nc")


def test_netcdf_safe_attrs():
    assert netcdf_safe({"a": True, "b": None, "c": 1, "d": [1, 2]}) == {
        "a": "True",
        "b": "None",
        "c": 1,
        "d": "[1, 2]",
    }


def test_write_text_atomic(tmp_path):
    path = write_text_atomic(tmp_path / "sub" / "a.html", "<p>hi</p>")
    assert path.read_text() == "<p>hi</p>" and os.listdir(path.parent) == ["a.html"]


def test_schema_allows_only_the_metrics_a_result_chose_to_leave_out():
    full = make_collapse_dataset()
    check_schema(full)
    # No `metrics` attribute (a result from before --metrics): every variable is required.
    with pytest.raises(probe.ProbeError, match="without the variable 'stable_rank'"):
        check_schema(full.drop_vars("stable_rank"))
    chose = full.drop_vars("stable_rank").assign_attrs(
        metrics="relative_residual,effective_rank,cosine_similarity"
    )
    check_schema(chose)
    # It says it computed the stable rank, which is not there: damaged.
    with pytest.raises(probe.ProbeError, match="without the variable 'stable_rank'"):
        check_schema(chose.assign_attrs(metrics=chose.attrs["metrics"] + ",stable_rank"))
    # The relative residual may never be left out.
    with pytest.raises(probe.ProbeError, match="without the variable 'relative_residual'"):
        check_schema(full.drop_vars("relative_residual").assign_attrs(metrics="stable_rank"))


def test_save_result_refuses_what_is_not_a_dataset_or_a_file_path(tmp_path):
    ds = xr.Dataset({"x": ("layer", [1.0])}, attrs={"analysis": "collapse"})
    with pytest.raises(probe.ProbeError, match=r"^`ds` must be an xarray.Dataset; got list$"):
        save_result([1.0], tmp_path / "r.nc")
    with pytest.raises(probe.ProbeError, match=r"^`path` must be a file path"):
        save_result(ds, "  ")
    with pytest.raises(probe.ProbeError, match=r"^`path` must be a file path"):
        save_result(ds, 3)
    with pytest.raises(probe.ProbeError, match="a folder is in the way"):
        save_result(ds, tmp_path)  # a folder, not a file: nothing staged is left behind
    assert os.listdir(tmp_path) == []
