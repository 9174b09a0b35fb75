"""`probe toy ...` end to end in --quick mode: files, reports, learning, seeds, errors,
the paper's path rules and circle setup, the listed deviations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.app import app
from probe.analyses import toy
from probe.files.results import open_result
from probe.measures.path_vocabulary import parse_path, path_length
from probe.reports import index_entries, toy_name
from probe.toy.train import baselines
from tests.reference import metrics_numpy

runner = CliRunner()
TASKS = ("sort", "convex-hull", "memorization", "circle")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    """Each task once through the CLI with --quick; {task: (Dataset, html text)}."""
    out = tmp_path_factory.mktemp("toy")
    runs = {"_stdout": {}}
    for task in TASKS:
        result = invoke("toy", task, "--quick", "--seed", 3, "--out", out)
        assert result.exit_code == 0, result.output
        runs["_stdout"][task] = result.stdout
        (nc,) = out.glob(f"toy-{task}-seed3-quick-*.nc")  # the last part: a settings hash
        runs[task] = (open_result(nc), nc.with_suffix(".html").read_text())
    runs["_out"] = out
    return runs


@pytest.mark.parametrize("task", TASKS)
def test_quick_training_lowers_the_loss(quick_runs, task) -> None:
    loss = quick_runs[task][0].train_loss
    if "variant" in loss.dims:
        # The circle trains at the paper's rate, 1e-5: ten quick epochs move the loss a little.
        assert (loss.isel(epoch=-1) < loss.isel(epoch=0)).all()
    else:
        # Convex hull in --quick mode first learns the label prior (loss ~0.74 -> ~0.67,
        # the entropy of the on-hull rate); the other tasks drop much further.
        assert float(loss[-1]) < float(loss[0]) - 0.02


@pytest.mark.parametrize("task", ["sort", "convex-hull", "memorization"])
def test_path_results(quick_runs, task) -> None:
    ds, html = quick_runs[task]
    depth = ds.attrs["depth"]
    assert ds.accuracy.dims == ("path_length", "repeat")
    assert list(ds.path_length.values) == list(range(depth + 1))
    assert ds.sizes["repeat"] == 5 and ds.sizes["path"] == 5
    assert ((ds.accuracy >= 0) & (ds.accuracy <= 1)).all()
    for k in ds.path_length.values:  # every recorded path has its length
        for text in ds.paths.sel(path_length=k).values.ravel():
            assert path_length(parse_path(str(text), heads=ds.attrs["width"])) == k
    # The five length-0 paths are all the skip path: nothing random left, std 0.
    assert float(ds.accuracy.sel(path_length=0).std()) == 0
    assert 0 <= float(ds.full_accuracy) <= 1 and 0 <= float(ds.baseline_majority) <= 1
    assert '<meta name="probe:analysis" content="toy">' in html
    assert html.count("<svg") == 2 and "accuracy against path length" in html
    # The paper's rules by default, said in the result, the summary and the meta tag.
    assert (ds.attrs["path_attention"], ds.attrs["path_norm"]) == ("own", "paper")
    assert "recomputed from the path&#x27;s own state (the paper&#x27;s rule)" in html
    assert 'content="no-sub-path (attention own, norm paper)"' in html


def test_circle_results(quick_runs) -> None:
    ds, html = quick_runs["circle"]
    assert list(ds.variant.values) == ["SAN", "SAN+skip", "SAN+MLP"]
    assert list(ds.hidden.values) == [32, 128]  # the paper's sweep
    assert ds.attrs["setup"] == "paper"
    assert ds.trajectory.dims == ("hidden", "variant", "step", "token", "coord")
    # Step 0 is the start for every network: point 0 and point 99 of 200 (the paper's
    # pairing), whose residual an independent numpy computation gives.
    start = ds.trajectory.isel(step=0).values
    assert (start == start[0, 0]).all()
    np.testing.assert_allclose(start[0, 0, 1], [0.3 * np.cos(2 * np.pi * 99 / 200),
                                                0.3 * np.sin(2 * np.pi * 99 / 200)], atol=1e-7)  # fmt: skip
    want = metrics_numpy.relative_residual(start[0, 0][None], norm="l1inf", fit="mean")[0]
    np.testing.assert_allclose(ds.relative_residual.sel(step=0), want, rtol=1e-12)
    assert html.count("<svg") == 3 and "trajectories of the two points" in html
    assert "every network keeps the attention skip connection" in html


def test_circle_setups_share_one_network() -> None:
    """The paper's SAN keeps the attention skip, which is probe's strict SAN+skip: with one
    seed the two are the same network, trained the same way, to the last bit."""
    kw = dict(quick=True, epochs=2, steps=10, hidden="32", seed=4)
    paper, strict = toy.run("circle", setup="paper", **kw), toy.run("circle", setup="strict", **kw)
    assert strict.attrs["setup"] == "strict" and "not the paper" in strict.attrs["variants"]
    same = paper.trajectory.sel(variant="SAN"), strict.trajectory.sel(variant="SAN+skip")
    assert np.array_equal(*same)
    assert not np.array_equal(paper.trajectory.sel(variant="SAN"),
                              strict.trajectory.sel(variant="SAN"))  # fmt: skip
    assert any("`setup` strict" in line for line in json.loads(strict.attrs["deviations"]))


def test_path_rules_are_recorded_and_change_the_numbers() -> None:
    kw = dict(quick=True, epochs=3, repeats=2, seed=2)
    paper = toy.run("sort", **kw)
    probe_rules = toy.run("sort", path_attention="full", path_norm="trained", **kw)
    assert (probe_rules.attrs["path_attention"], probe_rules.attrs["path_norm"]) == (
        "full",
        "trained",
    )
    # Same network, same paths: only the rules differ.
    assert np.array_equal(paper.train_loss, probe_rules.train_loss)
    assert np.array_equal(paper.paths, probe_rules.paths)
    assert not np.array_equal(paper.accuracy, probe_rules.accuracy)
    gone = json.loads(probe_rules.attrs["deviations"])
    assert any("`path_attention` own" in line for line in gone)
    assert any("`path_norm` paper" in line for line in gone)
    assert not any("path" in line for line in json.loads(paper.attrs["deviations"]))


def test_deviations_name_the_flag_that_runs_the_papers_setting() -> None:
    gone = toy.deviations("sort", toy.settings("sort"), path_attention="own", path_norm="paper")
    assert gone[0].startswith("lr 0.001: the paper's is 1e-05 (`lr` 1e-05 runs it)")
    theirs = toy.settings("sort", lr=1e-5)
    assert not any(line.startswith("lr") for line in toy.deviations("sort", theirs))
    hull = toy.deviations("convex-hull", toy.settings("convex-hull", box=1.0, shift=0.0,
                                                      weight_decay=0.0, schedule="constant"))  # fmt: skip
    for flag in ("`box` 10", "`shift` 3.3", "`weight_decay` 0.001", "`schedule` steps"):
        assert any(flag in line for line in hull), flag
    memo = toy.deviations("memorization", toy.settings("memorization", positions=True))
    assert any("leaving out `positions` runs it" in line for line in memo)
    assert any("RTE" in line for line in memo)
    # The circle at its defaults runs the paper's settings but one: the number of steps.
    circle = toy.deviations("circle", toy.settings("circle"), setup="paper")
    assert circle == [line for line in circle if line.startswith("steps 300")] and circle


def test_the_cli_lists_the_deviations_with_its_flags(quick_runs) -> None:
    """The library names the parameter that runs the paper's value; the command line shows
    its option, memorization's --sequences included (it sets the library's ``train``)."""
    printed = quick_runs["_stdout"]
    assert "(--lr 1e-05 runs it)" in printed["sort"]
    assert "train 24: the paper's is 500 (--sequences 500 runs it)" in printed["memorization"]
    listed = [line for out in printed.values() for line in out.splitlines() if line[:4] == "  - "]
    assert listed and not any("`" in line for line in listed)


def test_index_lists_the_reports(quick_runs) -> None:
    entries = index_entries(quick_runs["_out"])
    assert {e["model"] for e in entries} == {f"toy-{t}" for t in TASKS}
    assert all(e["analysis"] == "toy" for e in entries)
    assert (quick_runs["_out"] / "index.html").is_file()


def test_reports_make_no_requests(quick_runs) -> None:
    for task in TASKS:
        html = quick_runs[task][1]
        assert "http://" not in html.split("<body>")[1].replace("http://www.w3.org", "")
        assert "https://" not in html.split("<body>")[1]


def test_seeds_give_identical_results() -> None:
    a = toy.run("sort", quick=True, epochs=2, repeats=2, seed=5)
    b = toy.run("sort", quick=True, epochs=2, repeats=2, seed=5)
    c = toy.run("sort", quick=True, epochs=2, repeats=2, seed=6)
    for name in ("accuracy", "train_loss", "full_accuracy", "paths"):
        assert np.array_equal(a[name].values, b[name].values), name
    assert not np.array_equal(a.train_loss.values, c.train_loss.values)
    # The file name hashes the settings, not the timings: a rerun replaces its own file.
    slower = b.copy()
    slower.attrs.update(seconds=b.attrs["seconds"] + 7, train_seconds=99.0, threads=16)
    assert toy_name(a) == toy_name(b) == toy_name(slower) and toy_name(a) != toy_name(c)


def test_sub_path_mode_runs_the_exact_decomposition() -> None:
    ds = toy.run("sort", quick=True, epochs=2, repeats=2, sub_path=True)
    assert ds.attrs["sub_path"] is True
    assert ds.accuracy.sizes == {"path_length": 7, "repeat": 2}


def test_baselines_are_measured() -> None:
    y_train = torch.tensor([[0, 1], [0, 1], [2, 1]])
    y_eval = torch.tensor([[0, 0], [2, 1]])
    # Overall majority label 1 (3 of 6): right on 1 of 4 eval tokens.
    # Per position: 0 then 1: right on (0, _), (_, 1) = 2 of 4.
    assert baselines(y_train, y_eval) == {"majority": 0.25, "position": 0.5}


@pytest.mark.parametrize(
    "args, message",
    [
        (["sort", "--hidden", "47"], "not a multiple of --width"),
        (["sort", "--device", "tpu"], "--device"),
        (["circle", "--points", "7"], "even number of points"),
        (["memorization", "--text", "/nonexistent/t.txt"], "no such text file"),
        (["sort", "--epochs", "0"], "--epochs"),
        (["sort", "--path-attention", "mean"], "--path-attention"),
        (["convex-hull", "--path-norm", "frozen"], "--path-norm"),
        (["sort", "--sub-path", "--path-norm", "paper"], "--sub-path uses the full model"),
        (["sort", "--schedule", "cosine"], "--schedule"),
        (["circle", "--setup", "loose"], "--setup"),
        (["circle", "--hidden", "32,abc"], "--hidden"),
        (["circle", "--hidden", "33"], "not a multiple of --width"),
    ],
)
def test_bad_input_is_one_line(args, message, tmp_path) -> None:
    result = runner.invoke(app, ["toy", *args, "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.nc"))


def test_out_is_a_file(tmp_path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    result = runner.invoke(app, ["toy", "circle", "--quick", "--out", str(target)])
    assert result.exit_code == 2 and "is a file" in result.output


def readme_toy_commands() -> list[str]:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = "".join((root / page).read_text() for page in ("README.md", "docs/toy.md"))
    blocks = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return list(dict.fromkeys(line for line in lines if line.startswith("probe toy ")))


def test_readme_lists_every_task() -> None:
    named = {c.split()[2] for c in readme_toy_commands()}
    assert named == set(TASKS)


@pytest.mark.parametrize(
    "command", [c for c in readme_toy_commands() if c.split()[3:] not in ([], ["--quick"])]
)
def test_readme_toy_example(command, tmp_path) -> None:
    """Each example of the README and docs/toy.md with options runs (shortened: --quick,
    one epoch); the bare `probe toy TASK` and `probe toy TASK --quick` lines are the
    quick_runs fixture's commands."""
    import shlex

    args = shlex.split(command)[1:] + ["--quick", "--epochs", "1", "--out", str(tmp_path)]
    if args[1] != "circle":  # fewer paths scored (the last value given wins): the same code
        args += ["--n-paths", "2", "--repeats", "1"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert len(list(tmp_path.glob("toy-*.nc"))) == 1


def test_report_build_renders_a_toy_result(quick_runs, tmp_path) -> None:
    (nc,) = quick_runs["_out"].glob("toy-circle-seed3-quick-*.nc")
    result = invoke("report", "build", nc, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    html = (tmp_path / nc.with_suffix(".html").name).read_text()
    assert html.count("<svg") == 3 and 'content="toy"' in html


@pytest.mark.slow  # about a minute: quick sort and circle runs, which the CLI tests also make
def test_readme_toy_python_block() -> None:
    """docs/toy.md's Python example for `probe toy` runs as written (it asks for --quick)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "toy.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "toy.run" in b]
    assert len(blocks) == 1
    scope: dict = {}
    exec(compile(blocks[0], "docs/toy.md", "exec"), scope)  # noqa: S102
    assert scope["ds"].attrs["path_attention"] == "own"
    assert scope["circle"].attrs["setup"] == "strict"
