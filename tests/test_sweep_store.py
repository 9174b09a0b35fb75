"""The sweep's point store: a point is known by what it ran, whatever grid holds it, and
several processes share one store safely (probe.analyses.sweep_points.Store)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from PIL import Image

import probe
from probe.analyses import sweep
from probe.analyses.sweep_points import FOLDER, Axis, Store, grid
from tests import cli_process
from tests.reference.tiny import tiny_spec_config

ARGS = ["--sequences", "2", "--batch-size", "2", "--tokens", "8", "--variants", "SAN",
        "--no-attention"]  # fmt: skip
SMALL = dict(init="random", sequences=2, batch_size=2, variants="SAN", attention=False)


def test_a_point_claimed_by_another_process_is_read_not_run_again(tmp_path):
    # flock locks belong to an open file description, so two threads that each open the
    # claim contend exactly as two processes do.
    store = Store(tmp_path / FOLDER, {"analysis": "test"})
    (point,) = grid([Axis("seed", "seed", (0,))])
    runs = []

    def slow():
        runs.append("slow")
        time.sleep(0.5)
        return xr.Dataset({"v": ("x", np.arange(3.0))})

    def fast():
        runs.append("fast")
        return xr.Dataset({"v": ("x", np.zeros(3))})

    first = {}
    thread = threading.Thread(target=lambda: first.update(out=store.keep(point, slow)))
    thread.start()
    while not list(store.folder.glob("*.lock")):  # the first has claimed the point
        time.sleep(0.01)
    ds, kept = store.keep(point, fast)
    thread.join()
    assert runs == ["slow"] and kept and not first["out"][1]
    np.testing.assert_array_equal(ds["v"].values, np.arange(3.0))
    assert not list(store.folder.glob("*.lock"))  # a claim does not outlive its point


def test_a_larger_grid_reuses_the_points_of_a_smaller_one(tiny_folders, tmp_path):
    store = tmp_path / FOLDER
    small = sweep.run(tiny_folders["gpt2"], tokens=8, seeds=[0, 1], store=store, **SMALL)
    labels = []
    large = sweep.run(tiny_folders["gpt2"], tokens=8, seeds=[0, 1, 2], store=store,
                      progress=lambda done, total, label: labels.append(label), **SMALL)  # fmt: skip
    assert [label.endswith("(kept from an earlier run)") for label in labels] == [1, 1, 0]
    for seed in (0, 1):
        assert (
            large["point_created"].sel(seed=seed).item()
            == small["point_created"].sel(seed=seed).item()
        )
        np.testing.assert_array_equal(
            large["relative_residual"].sel(seed=seed).values,
            small["relative_residual"].sel(seed=seed).values,
        )


def test_two_identical_sweeps_into_one_folder_both_finish(tiny_folders, tmp_path):
    args = ["sweep", tiny_folders["gpt2"], "--init", "random", *ARGS, "--seeds", "0-3",
            "--out", "r"]  # fmt: skip
    first = cli_process.start(args, tmp_path, tmp_path / "logs", "first")
    deadline = time.monotonic() + 300
    while not (tmp_path / "r" / FOLDER).is_dir() and time.monotonic() < deadline:
        time.sleep(0.02)
    second = cli_process.start(args, tmp_path, tmp_path / "logs", "second")
    assert first.wait() == 0, first.err()
    assert second.wait() == 0, second.err()
    # Each point ran once: the later sweep read what the earlier one had finished or claimed.
    ran = first.err().count("done") + second.err().count("done")
    kept = first.err().count("(kept from") + second.err().count("(kept from")
    assert ran - kept == 4, (first.err(), second.err())
    (nc,) = (tmp_path / "r").glob("sweep-*.nc")
    assert probe.open_result(nc)["done"].all()
    left = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert left == sorted([nc.name, nc.with_suffix(".html").name, "index.html"]), left


def _vit_folder(root: Path) -> str:
    from transformers import ViTModel

    torch.manual_seed(0)
    folder = root / "vit"
    ViTModel(tiny_spec_config("vit")).save_pretrained(folder)
    return str(folder)


def _images(folder: Path, seed: int) -> None:
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def test_images_changed_in_place_are_run_again_not_mixed(tmp_path):
    vit, images = _vit_folder(tmp_path), tmp_path / "images"
    _images(images, 0)
    args = ["sweep", vit, "--init", "random", "--images", "images", "--sequences", "2",
            "--variants", "SAN", "--no-attention", "--seeds", "0,1"]  # fmt: skip
    # The store of an interrupted sweep over the first images ...
    sweep.run(vit, probe.Inputs(images=images, sequences=2), seeds=[0, 1],
              store=tmp_path / "r" / FOLDER, init="random", variants="SAN", attention=False)  # fmt: skip
    _images(images, 1)  # ... then the same file names with other pixels
    again = cli_process.start([*args, "--out", "r"], tmp_path, tmp_path / "logs", "again")
    assert again.wait() == 0, again.err()
    assert "(kept from" not in again.err()
    fresh = cli_process.start([*args, "--out", "fresh"], tmp_path, tmp_path / "logs", "fresh")
    assert fresh.wait() == 0, fresh.err()
    (rerun,) = (tmp_path / "r").glob("sweep-*.nc")
    (alone,) = (tmp_path / "fresh").glob("sweep-*.nc")
    np.testing.assert_array_equal(
        probe.open_result(rerun)["relative_residual"].values,
        probe.open_result(alone)["relative_residual"].values,
    )
    # The first images' points are not this sweep's: they stay, and the command says so.
    assert len(list((tmp_path / "r" / FOLDER).glob("point-*.nc"))) == 2
    assert "keeps 2 points of other sweeps" in again.err()


def test_a_failed_torchrun_sweep_removes_what_it_created(tiny_folders, tmp_path):
    # Every point overflows (a branch scale of 1e30 in float32): no point finishes, so the
    # job leaves nothing behind, neither --out nor the store in it.
    done = cli_process.launch(
        ["sweep", tiny_folders["gpt2"], "--init", "random", *ARGS, "--seeds", "0,1",
         "--branch-scale", "1e30"], "r", ranks=2, cwd=tmp_path)  # fmt: skip
    assert done.returncode != 0, done.stderr[-3000:]  # torchrun says 1 for a rank's 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("probe: error:")]
    assert len(errors) == 1 and "overflowed" in errors[0], done.stderr[-3000:]
    assert not (tmp_path / "r").exists()


def test_two_sweeps_that_overlap_in_one_store_leave_nothing_behind(tmp_path):
    """Sweep A finishes while sweep B still uses the store: A may not remove its points
    (B may be reading one), so it says them finished; B, the last to let go, removes A's
    finished points with its own, and the store's folder with its markers.  Two holds in
    one process contend as two processes do (flock belongs to an open file description)."""
    folder = tmp_path / FOLDER
    a, b = Store(folder, {"analysis": "test"}), Store(folder, {"analysis": "test"})
    points_a = grid([Axis("seed", "seed", (0, 1))])
    points_b = grid([Axis("seed", "seed", (1, 2))])
    data = xr.Dataset({"v": ("x", np.arange(3.0))})
    with b.using():
        with a.using():
            for point in points_a:
                a.keep(point, lambda: data)
            for point in points_b:
                b.keep(point, lambda: data)
            assert a.clean(points_a) == 0  # b holds the store too
        assert folder.is_dir() and {p.name for p in folder.glob("point-*.nc")} == {
            a.path(p).name for p in [*points_a, *points_b]
        }
        assert b.clean(points_b) == 0  # alone now: its own points go
    assert not folder.exists()  # and, once b let go, a's finished points and the markers


def test_a_point_of_an_unfinished_sweep_stays_for_its_resume(tmp_path):
    """Only points said finished are removed: an interrupted sweep's stay, as alone."""
    folder = tmp_path / FOLDER
    a, b = Store(folder, {"analysis": "test"}), Store(folder, {"analysis": "test"})
    (kept,) = grid([Axis("seed", "seed", (7,))])
    (done,) = grid([Axis("seed", "seed", (8,))])
    data = xr.Dataset({"v": ("x", np.arange(3.0))})
    with b.using():
        with a.using():
            a.keep(kept, lambda: data)  # a stops here, its result unwritten
            b.keep(done, lambda: data)
        assert b.clean([done]) == 1
    assert [p.name for p in folder.glob("point-*.nc")] == [a.path(kept).name]
