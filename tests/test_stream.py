"""probe.files.stream and collapse.run(stream_to=...): results appended batch by batch, atomically."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import probe
from probe.analyses import collapse
from probe.files import stream

OPTIONS = {"init": "random", "sequences": 5, "tokens": 8, "batch_size": 2}  # 3 batches, last short


@pytest.fixture(scope="module")
def tiny_gpt2(tiny_folders):
    return probe.load(tiny_folders["gpt2"], init="random")


def test_streamed_result_equals_the_in_memory_one(tiny_gpt2, tmp_path, monkeypatch):
    lengths = []
    append = stream.SequenceWriter.append
    monkeypatch.setattr(
        stream.SequenceWriter,
        "append",
        lambda self, block: (
            lengths.append(block["effective_rank"].shape[-1]),
            append(self, block),
        ),
    )
    path = tmp_path / "r.nc"
    streamed = collapse.run(tiny_gpt2, stream_to=path, command="c", **OPTIONS)
    assert lengths == [2, 2, 1]  # one batch of results at a time
    memory = collapse.run(tiny_gpt2, command="c", **OPTIONS)
    for name in (*collapse.METRICS, "mu"):  # same forwards, same metrics: bit for bit
        xr.testing.assert_identical(streamed[name].load(), memory[name])
    same_attrs = {k: v for k, v in memory.attrs.items() if k != "created"}
    assert {k: streamed.attrs[k] for k in same_attrs} == probe.files.results.netcdf_safe(same_attrs)
    streamed.close()
    reopened = probe.open_result(path)
    assert reopened.sizes["sequence"] == 5
    np.testing.assert_array_equal(reopened["sequence"], np.arange(5))
    assert list(tmp_path.iterdir()) == [path]


def test_a_failed_run_leaves_no_file(tiny_gpt2, tmp_path):
    def progress(done, total, label):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collapse.run(tiny_gpt2, stream_to=tmp_path / "r.nc", progress=progress, **OPTIONS)
    assert list(tmp_path.iterdir()) == []


def test_writer_checks_its_input(tmp_path):
    full = xr.Dataset({"a": (("x", "sequence"), np.zeros((2, 3)))})
    with pytest.raises(ValueError, match="empty 'sequence' dimension"):
        stream.SequenceWriter(tmp_path / "r.nc", full)
    empty = xr.Dataset(
        {"a": (("x", "sequence"), np.zeros((2, 0))), "b": (("sequence",), np.zeros(0))},
        coords={"sequence": np.arange(0)},
    )
    with stream.SequenceWriter(tmp_path / "r.nc", empty) as writer:
        with pytest.raises(ValueError, match="a block needs each of a, b once"):
            writer.append({"a": np.ones((2, 4))})
        writer.append({"a": np.ones((2, 4)), "b": np.arange(4.0)})
        writer.append({"a": 2 * np.ones((2, 1)), "b": np.arange(1.0)})
    with xr.open_dataset(tmp_path / "r.nc", engine="h5netcdf") as ds:
        np.testing.assert_array_equal(ds["a"], [[1, 1, 1, 1, 2]] * 2)
        np.testing.assert_array_equal(ds["b"], [0, 1, 2, 3, 0])
        np.testing.assert_array_equal(ds["sequence"], np.arange(5))
