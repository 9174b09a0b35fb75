"""Gathering a sweep's points: what differs between points is kept per point, not dropped."""

from __future__ import annotations

import json

import probe
from probe.analyses import sweep


def test_what_each_point_removed_is_kept_per_point(tiny_folders, tmp_path):
    ds = sweep.run(tiny_folders["gpt2"], init="random", sequences=2, tokens=8,
                   config={"n_layer": [1, 2]}, variants=["SAN", "no-sink"],
                   attention=False)  # fmt: skip
    alone = [
        sweep.collapse.run(
            tiny_folders["gpt2"],
            init="random",
            sequences=2,
            tokens=8,
            config={"n_layer": n},
            variants=["SAN", "no-sink"],
        )  # fmt: skip
        for n in (1, 2)
    ]
    assert "removed" not in ds.attrs and "removal_note" not in ds.attrs
    for n, one in zip((1, 2), alone, strict=True):
        assert ds["removed"].sel(n_layer=n).item() == one.attrs["removed"]
        assert ds["removal_note"].sel(n_layer=n).item() == one.attrs["removal_note"]
        assert json.loads(ds["config"].sel(n_layer=n).item())["n_layer"] == n
    # the per-point variables survive the result file
    path = probe.save_result(ds, tmp_path / "sweep.nc")
    assert probe.open_result(path)["removed"].sel(n_layer=2).item() == alone[1].attrs["removed"]
