"""A stopped sweep keeps its finished points and the same command resumes; torchrun's ranks
split the points and give the single-process result.

The command runs in a process of its own (tests/cli_process.py): SIGINT or ``kill -9`` is
sent once the first point's file is in the store.  Every file the store then holds must be a
whole point, and the rerun must take those points from the store (their creation time is
the one they had before the rerun) and finish the sweep.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import probe
from probe.files.results import ENGINE
from tests import cli_process

SEEDS = 4
ARGS = ["--init", "random", "--sequences", "2", "--batch-size", "2", "--tokens", "8",
        "--variants", "SAN", "--no-attention"]  # fmt: skip


def _first_point(run, out: Path, timeout: float = 300) -> list[Path]:
    end = time.monotonic() + timeout
    while time.monotonic() < end and run.process.exitcode is None:
        found = list(out.glob("sweep-points/point-*.nc"))
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no point was stored\n{run.err()}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_stopped_sweep_resumes_from_its_finished_points(tiny_folders, tmp_path, signum):
    args = ["sweep", tiny_folders["gpt2"], *ARGS, "--seeds", f"0-{SEEDS - 1}", "--out", "r"]
    run = cli_process.start(args, tmp_path, tmp_path / "logs", "stopped")
    _first_point(run, tmp_path / "r")
    os.kill(run.pid, signum)
    code = run.wait()
    assert code == (130 if signum == signal.SIGINT else -signal.SIGKILL), run.err()
    kept = {}
    for path in (tmp_path / "r").glob("sweep-points/point-*.nc"):
        with xr.open_dataset(path, engine=ENGINE) as ds:  # a whole point, never half of one
            kept[int(ds.attrs["seed"])] = (ds.attrs["created"], ds["relative_residual"].values)
    assert 1 <= len(kept) < SEEDS, run.err()
    if signum == signal.SIGINT:  # one line says what was written and what resumes
        (line,) = [x for x in run.err().splitlines() if "kept" in x or "error" in x]
        assert line == (
            "probe: error: interrupted; written before the interrupt: r/sweep-points; nothing "
            f"else was written; {len(kept)} of {SEEDS} points are kept there, and the same "
            "command resumes from them"
        ), run.err()
    again = cli_process.start(args, tmp_path, tmp_path / "logs", "again")
    assert again.wait() == 0, again.err()
    assert again.err().count("(kept from an earlier run) done") == len(kept)
    (nc,) = (tmp_path / "r").glob("sweep-*.nc")
    ds = probe.open_result(nc)
    assert ds.attrs["points_done"] == SEEDS and ds["done"].all()
    for seed, (created, residual) in kept.items():
        assert ds["point_created"].sel(seed=seed).item() == created  # taken from the store
        np.testing.assert_array_equal(ds["relative_residual"].sel(seed=seed).values, residual)
    left = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert left == sorted([nc.name, nc.with_suffix(".html").name, "index.html"]), left


@pytest.mark.parametrize(
    "grid",
    [
        pytest.param(["--seeds", "0-1", "--tokens", "8"], id="a point a rank"),
        # six points over two ranks: about two minutes on a shared CPU
        pytest.param(["--seeds", "0-2", "--tokens", "8,12"], id="six", marks=pytest.mark.slow),
    ],
)
def test_torchrun_gives_the_single_process_result(tiny_folders, tmp_path, monkeypatch, grid):
    args = ["sweep", tiny_folders["gpt2"], *ARGS, *grid, "-q"]
    _, two, one = cli_process.torchrun_beside_plain(
        args, tmp_path, monkeypatch, "sweep-*.nc", timeout=600
    )
    assert two.name == one.name
    a, b = probe.open_result(two), probe.open_result(one)
    assert a.attrs["world_size"] == 2 and b.attrs["world_size"] == 1
    variable = [n for n in a.data_vars if n not in ("point_created", "seconds")]
    for name in variable:
        xr.testing.assert_identical(a[name], b[name])  # bit for bit
    assert sorted(p.name for p in two.parent.iterdir()) == sorted(
        p.name for p in one.parent.iterdir()
    )


@pytest.mark.slow  # GPT-2's width at 2 to 16 layers, 8 points and 8 collapse runs: minutes
def test_a_depth_and_scale_sweep_equals_collapse_point_by_point(tmp_path, monkeypatch):
    """`probe sweep gpt2 --init random --set n_layer=2,4,8,16 --branch-scale
    1,1/sqrt(L) --sequences 4 --tokens 32` writes one result and its report, and each of its
    8 points equals `probe collapse` with that config and scale, bit for bit."""
    from typer.testing import CliRunner

    from probe import Inputs, Model
    from probe.analyses import collapse
    from probe.cli.app import app

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "gpt2", "--init", "random", "--set", "n_layer=2,4,8,16", "--branch-scale",
            "1,1/sqrt(L)", "--sequences", "4", "--tokens", "32", "--out", "r", "-q"]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    (nc,) = (tmp_path / "r").glob("sweep-gpt2-random-float32-*.nc")
    assert nc.with_suffix(".html").is_file()
    ds = probe.open_result(nc)
    assert ds.sizes["n_layer"] * ds.sizes["branch_scale"] == 8 and ds["done"].all()
    for layers in (2, 4, 8, 16):
        for scale in ("1", "1/sqrt(L)"):
            alone = collapse.run(
                Model("gpt2", init="random", config={"n_layer": layers}),
                Inputs(sequences=4, tokens=32),
                branch_scale=scale,
            )
            point = ds.sel(n_layer=layers, branch_scale=scale, layer=range(layers + 1))
            for name in ("relative_residual", "effective_rank", "stable_rank",
                         "cosine_similarity"):  # fmt: skip
                np.testing.assert_array_equal(point[name].values, alone[name].values)
            assert point["request"].item() == alone.attrs["request"]
