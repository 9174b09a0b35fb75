"""Models spread by ``device_map`` (accelerate): offloaded to disk, the numbers of the unsplit model.

Forced on the CPU with a ``max_memory`` smaller than the model: accelerate keeps the first
modules in memory and sends the rest to the disk (meta tensors under its hooks, read in for
each forward).  The same operations run on the same values, so every number must equal the
unsplit model's exactly.
"""

from __future__ import annotations

import pytest
import xarray as xr
from typer.testing import CliRunner

import probe
from probe.analyses import collapse, path_decompose
from probe.errors import ProbeError

OPTIONS = {"init": "random", "sequences": 3, "tokens": 8, "batch_size": 2, "command": "c"}


def _bytes(probed) -> int:
    return sum(p.numel() * p.element_size() for p in probed.model.parameters())


def _offloaded(folder, tmp_path, dtype="float64"):
    whole = probe.load(folder, init="random", dtype=dtype)
    # 60% of the model's bytes: the embeddings stay in memory, the layers go to disk.
    spread = probe.load(
        folder,
        init="random",
        dtype=dtype,
        device_map="auto",
        max_memory={"cpu": int(0.6 * _bytes(whole))},
        offload_folder=tmp_path / "offload",
    )
    return whole, spread


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_an_offloaded_model_passes_the_self_test_with_nothing_remembered(
    tiny_folders, tmp_path, monkeypatch, family
):
    size = _bytes(probe.load(tiny_folders[family], init="random", dtype="float64"))
    # A fresh cache: the self-test runs on the offloaded model itself, its LayerNorm
    # identities reading the norms' weights after accelerate's hooks sent them to disk.
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path / "cache"))
    spread = probe.load(
        tiny_folders[family],
        init="random",
        dtype="float64",
        device_map="auto",
        max_memory={"cpu": int(0.6 * size)},
        offload_folder=tmp_path / "offload",
    )
    assert any(p.device.type == "meta" for p in spread.model.parameters())
    assert list((tmp_path / "cache").rglob("*")), "the pass is remembered"


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_collapse_on_a_disk_offloaded_model_equals_the_unsplit_one(tiny_folders, tmp_path, family):
    whole, spread = _offloaded(tiny_folders[family], tmp_path)
    placed = set(spread.device_map.values())
    assert "disk" in placed and "cpu" in placed, spread.device_map
    assert any(p.device.type == "meta" for p in spread.model.parameters())  # really offloaded
    assert spread.device.type == "cpu"  # the input device, not the meta device
    a, b = collapse.run(whole, **OPTIONS), collapse.run(spread, **OPTIONS)
    for name in ("relative_residual", "effective_rank", "stable_rank", "cosine_similarity"):
        xr.testing.assert_identical(a[name], b[name])  # exact: the same arithmetic
    assert "disk" in b.attrs["device_map"] and a.attrs["device_map"] == "{}"
    assert a.attrs["settings_id"] == b.attrs["settings_id"]  # same numbers, same file name


def test_path_decomposition_reads_offloaded_weights(tiny_folders, tmp_path):
    whole, spread = _offloaded(tiny_folders["gpt2"], tmp_path)
    options = {"init": "random", "sequences": 2, "tokens": 6, "dtype": None, "command": "c"}
    a = path_decompose.decompose(whole, **options)
    b = path_decompose.decompose(spread, **options)
    assert a.data_vars.keys() == b.data_vars.keys()
    for name in a.data_vars:
        xr.testing.assert_identical(a[name], b[name])
    # The weights went back to the disk afterwards.
    assert any(p.device.type == "meta" for p in spread.model.parameters())


SMALL = ["--init", "random", "--sequences", "3", "--tokens", "8", "-q"]


@pytest.mark.parametrize(
    ("command", "compared"),
    [
        (["collapse", "{model}"], ("relative_residual", "effective_rank")),
        (["paths", "--decompose", "{model}"], ("share", "truncation_error", "loss")),
        (["paths", "--sample", "{model}", "--samples", "4"], ("ratio",)),
    ],
    ids=["collapse", "paths-decompose", "paths-sample"],
)
def test_cli_device_map_gives_the_unsplit_numbers(tiny_folders, tmp_path, command, compared):
    from probe.cli.app import app

    # float32: 120 kB of weights; 72 kB keeps the embeddings in memory, the layers on disk.
    args = [word.format(model=tiny_folders["gpt2"]) for word in command] + SMALL
    if command[0] == "paths":
        args += ["--dtype", "float32"]
    runner = CliRunner()
    plain = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    spread = runner.invoke(
        app,
        [*args, "--device-map", "auto", "--max-memory", "cpu=72000", "--out", str(tmp_path / "b")],
    )
    assert plain.exit_code == 0 and spread.exit_code == 0, plain.output + spread.output
    (a,) = (tmp_path / "a").glob("*.nc")
    (b,) = (tmp_path / "b").glob("*.nc")
    a, b = probe.open_result(a), probe.open_result(b)
    if command[0] == "collapse":
        assert "disk" in b.attrs["device_map"]
    for name in compared:
        xr.testing.assert_identical(a[name], b[name])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-memory", "cpu=1GiB"], "--max-memory and --offload-folder go with --device-map"),
        # no CUDA here: the validation layer refuses --device cuda first, in its own line
        (["--device-map", "auto", "--device", "cuda"], "probe: error:"),
        (["--device-map", "auto", "--max-memory", "cpu"], "DEVICE=SIZE pairs"),
        (["--device-map", "auto", "--max-memory", "cpu=10"], "no room for any module"),
    ],
)
@pytest.mark.parametrize("command", [["collapse"], ["paths", "--decompose"]])
def test_cli_refuses_bad_device_maps_in_one_line(tiny_folders, tmp_path, extra, message, command):
    from probe.cli.app import app

    result = CliRunner().invoke(
        app, [*command, tiny_folders["gpt2"], "--init", "random", *extra, "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert not any(tmp_path.iterdir())


def test_library_refuses_an_unknown_map(tiny_folders):
    with pytest.raises(ProbeError, match="unknown device map 'everywhere'"):
        probe.load(tiny_folders["gpt2"], init="random", device_map="everywhere")


def test_library_refuses_placement_options_without_a_map(tiny_folders):
    # probe.load checks them, so every analysis that loads by name does too.
    with pytest.raises(ProbeError, match="`max_memory` and `offload_folder` go with"):
        probe.load(tiny_folders["gpt2"], init="random", max_memory={"cpu": "1GiB"})
    with pytest.raises(ProbeError, match="`max_memory` and `offload_folder` go with"):
        path_decompose.decompose(tiny_folders["gpt2"], init="random", offload_folder="x")
