"""Data-parallel collapse runs (probe.distributed): shards, their merge, and torchrun itself.

The oracle is the single-process run of the same command: a sharded run must equal it bit
for bit (every batch is the same forward pass), record its world size, and publish nothing
when any rank fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import xarray as xr
from hypothesis import given
from hypothesis import strategies as st

import probe
from probe import distributed
from probe.analyses import collapse
from probe.errors import ProbeError
from probe.measures import bounds
from tests.cli_process import launch, torchrun_beside_plain

OPTIONS = {"init": "random", "sequences": 7, "tokens": 8, "batch_size": 2}  # 4 batches, last short
METRICS = ("relative_residual", "mu", "effective_rank", "stable_rank", "cosine_similarity")


@given(st.integers(0, 300), st.integers(1, 40))
def test_shards_cover_the_items_once_in_rank_order(items, size):
    spans = [distributed.shard(items, rank, size) for rank in range(size)]
    assert spans[0][0] == 0 and spans[-1][1] == items
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    lengths = [stop - start for start, stop in spans]
    assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)


@pytest.fixture(scope="module")
def tiny_gpt2(tiny_folders):
    return probe.load(tiny_folders["gpt2"], init="random")


@pytest.mark.parametrize("size", [2, 3, 5])  # 3: uneven shares; 5: a rank with no batch
def test_shards_merge_into_the_single_process_result(tiny_gpt2, tmp_path, size):
    plan = collapse.prepare(tiny_gpt2, command="c", **OPTIONS)
    whole = collapse.execute(plan)
    paths = []
    for rank in range(size):
        paths.append(tmp_path / f"shard-{rank}.nc")
        shard = collapse.execute(plan, stream_to=paths[-1], part=(rank, size))
        start, stop = distributed.shard(4, rank, size)
        # Global numbers in every shard: sequences 2*start .. of the whole run.
        np.testing.assert_array_equal(shard["sequence"], np.arange(2 * start, min(2 * stop, 7)))
        assert shard.attrs["sequences"] == 7 and shard.attrs["world_size"] == size
        shard.close()
    merged = distributed.merge(paths, size)
    for name in METRICS:
        xr.testing.assert_identical(merged[name].load(), whole[name])  # bit for bit
    for name in bounds.VARIABLES:  # the theory panel's variables: rank 0's, the whole run's
        xr.testing.assert_identical(merged[name].load(), whole[name])
    assert merged.attrs["world_size"] == size and whole.attrs["world_size"] == 1
    merged.close()


def test_merge_refuses_shards_of_another_run(tiny_gpt2, tmp_path):
    plan = collapse.prepare(tiny_gpt2, command="c", **OPTIONS)
    for rank in range(2):
        collapse.execute(plan, stream_to=tmp_path / f"{rank}.nc", part=(rank, 2)).close()
    with pytest.raises(ProbeError, match="not the shards of one run"):
        distributed.merge([tmp_path / "1.nc", tmp_path / "0.nc"], 2)
    with pytest.raises(ProbeError, match="hold 4 sequences, the run had 7"):
        distributed.merge([tmp_path / "0.nc"], 1)


PATHS = {"init": "random", "sequences": 7, "tokens": 8, "batch_size": 2, "command": "c"}


@pytest.mark.parametrize("size", [2, 3, 5])  # 3: uneven shares; 5: a rank with no batch
def test_path_parts_merge_into_the_single_process_result(tiny_gpt2, tmp_path, size):
    from probe.analyses import path_decompose, path_sample

    whole = {
        "sample": path_sample.sample(tiny_gpt2, samples=12, **PATHS),
        "decompose": path_decompose.decompose(tiny_gpt2, **PATHS),
    }
    shards: dict[str, list] = {"sample": [], "decompose": []}
    for rank in range(size):
        part = path_sample.sample(tiny_gpt2, samples=12, part=(rank, size), **PATHS)
        shards["sample"].append(tmp_path / f"sample-{rank}.nc")
        probe.save_result(part, shards["sample"][-1])
        part = path_decompose.decompose(tiny_gpt2, part=(rank, size), **PATHS)
        start, stop = distributed.shard(4, rank, size)
        np.testing.assert_array_equal(part["sequence"], np.arange(2 * start, min(2 * stop, 7)))
        if part.sizes["sequence"]:
            shards["decompose"].append(tmp_path / f"decompose-{rank}.nc")
            probe.save_result(part, shards["decompose"][-1])
    merged = {
        "sample": distributed.merge_parts(shards["sample"], size, "ratio"),
        "decompose": distributed.merge(shards["decompose"], size).load(),
    }
    for mode, ds in merged.items():
        assert not np.isnan(ds["share" if mode == "decompose" else "ratio"]).all()
        for name in whole[mode].data_vars:
            xr.testing.assert_identical(ds[name], whole[mode][name])  # bit for bit
        assert ds.attrs["world_size"] == size
    # A part counted twice is not a part of one run.
    with pytest.raises(ProbeError, match="not the parts of one run"):
        distributed.merge_parts([*shards["sample"], shards["sample"][0]], size, "ratio")


def test_the_world_comes_from_torchruns_variables(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert distributed.world() == distributed.World(0, 1, 0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    here = distributed.world()
    assert (here.rank, here.size, here.local_rank, here.main) == (3, 4, 1, False)
    assert distributed.device_for("cuda", here) == "cuda:1"
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ProbeError, match="rank 4 of a world of 4"):
        distributed.world()


# --- torchrun itself: 2 gloo processes on the CPU ------------------------------------------

ARGS = ["--init", "random", "--sequences", "6", "--tokens", "8", "--batch-size", "2", "-q"]


def test_torchrun_gives_the_single_process_result(tiny_folders, tmp_path, monkeypatch):
    args = ["collapse", tiny_folders["gpt2"], *ARGS]
    _, two, one = torchrun_beside_plain(args, tmp_path, monkeypatch, "collapse-*.nc")
    assert two.name == one.name  # the same settings: the same file name
    assert two.with_suffix(".html").is_file()
    a, b = probe.open_result(two), probe.open_result(one)
    for name in (*METRICS, *bounds.VARIABLES):
        xr.testing.assert_identical(a[name], b[name])  # bit for bit
    assert a.attrs["world_size"] == 2 and b.attrs["world_size"] == 1
    ignored = {"created", "world_size"}
    assert {k: v for k, v in a.attrs.items() if k not in ignored} == {
        k: v for k, v in b.attrs.items() if k not in ignored
    }
    # Only rank 0 printed; the shards are gone.
    assert sorted(p.name for p in two.parent.iterdir()) == sorted(
        p.name for p in one.parent.iterdir()
    )


def test_a_one_rank_torchrun_job_shards_and_merges_like_a_larger_one(
    tiny_folders, tmp_path, monkeypatch
):
    # torchrun's variables for one process, set here: the job sets up its process group
    # (gloo on the CPU; nccl beside it on GPUs, run by benchmarks/gpu.sh), streams its one
    # shard and merges it, and the result is the plain command's, bit for bit.
    import socket

    from typer.testing import CliRunner

    from probe.cli.app import app

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    args = ["collapse", tiny_folders["gpt2"], *ARGS]
    plain = CliRunner().invoke(app, [*args, "--out", "plain"])
    assert plain.exit_code == 0, plain.output
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torchrun = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "test"}  # fmt: skip
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    assert distributed.world() == distributed.World(0, 1, 0, launched=True)
    merged = []
    real_merge = distributed.merge
    monkeypatch.setattr(
        distributed,
        "merge",
        lambda shards, size: merged.append(list(shards)) or real_merge(shards, size),
    )
    job = CliRunner().invoke(app, [*args, "--out", "job"])
    assert job.exit_code == 0, job.output
    assert [len(shards) for shards in merged] == [1]  # one rank's shard, merged
    (a,) = (tmp_path / "plain").glob("collapse-*.nc")
    (b,) = (tmp_path / "job").glob("collapse-*.nc")
    a, b = probe.open_result(a), probe.open_result(b)
    for name in (*METRICS, *bounds.VARIABLES):
        xr.testing.assert_identical(a[name], b[name])  # bit for bit
    assert a.attrs["world_size"] == b.attrs["world_size"] == 1
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == sorted(
        p.name for p in (tmp_path / "plain").iterdir()
    )  # no shard left behind


def test_torchrun_paths_give_the_single_process_result(tiny_folders, tmp_path, monkeypatch):
    args = ["paths", "--sample", tiny_folders["gpt2"], "--samples", "10", *ARGS]
    done, two, one = torchrun_beside_plain(args, tmp_path, monkeypatch, "paths-sample-*.nc")
    assert two.name == one.name and two.with_suffix(".html").is_file()
    a, b = probe.open_result(two), probe.open_result(one)
    xr.testing.assert_identical(a["ratio"], b["ratio"])  # bit for bit
    assert not np.isnan(a["ratio"]).any()
    assert a.attrs["world_size"] == 2 and b.attrs["world_size"] == 1
    assert "SVD distance" in done.stdout  # rank 0 printed the table, once
    assert done.stdout.count("result: ") == 1
    assert sorted(p.name for p in two.parent.iterdir()) == sorted(
        p.name for p in one.parent.iterdir()
    )  # the shards are gone


def test_a_failed_rank_fails_the_run_and_publishes_nothing(tiny_folders, tmp_path):
    # Rank 1 breaks in its last batch: injected from outside probe, at interpreter start.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import os
            if os.environ.get("RANK") == "1":
                from probe.analyses import collapse_measure
                original = collapse_measure.blocks
                def broken(plan, batches, progress, part=(0, 1)):
                    for n, item in enumerate(original(plan, batches, progress)):
                        if n == len(batches) - 1:
                            raise RuntimeError("injected fault")
                        yield item
                collapse_measure.blocks = broken
            """
        )
    )
    out = tmp_path / "out"
    done = launch(
        ["collapse", tiny_folders["gpt2"], *ARGS],
        out,
        ranks=2,
        env={"PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])},
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("probe: error:")]
    assert errors == [
        "probe: error: rank 1 of 2 failed, no result was written: RuntimeError: injected fault"
    ]
    assert "Traceback" not in done.stdout
    assert not out.exists()  # no result, no report, no shard: not even the folder it made


def test_a_killed_jobs_shard_folder_is_removed_by_the_next_run(tmp_path):
    import socket

    from probe.files.results import clean_parts

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    host = socket.gethostname()
    stale = tmp_path / f".probe-shards-{host}-{int(dead.stdout)}-x1"
    live = tmp_path / f".probe-shards-{host}-{os.getpid()}-x2"
    elsewhere = tmp_path / f".probe-shards-another-host-{int(dead.stdout)}-x3"
    for folder in (stale, live, elsewhere):
        (folder / "rank-00001").mkdir(parents=True)
        (folder / "rank-00001" / "shard-000.nc").write_bytes(b"x")
    assert clean_parts(tmp_path) == [stale]
    # A live job's folder and one made on another node (its pid means nothing here) stay.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, elsewhere.name])
    folder = distributed.shard_folder(tmp_path / "out", distributed.World())
    assert folder.name.startswith(f".probe-shards-{host}-{os.getpid()}-")
    assert clean_parts(tmp_path / "out") == []  # this process is alive


def test_a_usage_error_under_torchrun_is_said_once(tmp_path):
    """Every rank meets a bad option alike: rank 0 says it, the others exit with the same
    status silently (torchrun then adds its own failure summary, which is torchrun's)."""
    done = launch(["collapse", "gpt2-tiny", "--init", "random", "--tokens", "0"],
                  tmp_path / "r", ranks=2, timeout=120)  # fmt: skip
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("probe: ")]
    assert lines == ["probe: error: --tokens must be a whole number from 2 to 2147483647, got 0"]
    assert not (tmp_path / "r").exists()
