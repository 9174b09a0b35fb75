"""The `probe` command through typer's CliRunner: outputs, files, one-line errors."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import probe
from cli.app import app
from tests.conftest import SLOW

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The pages whose shell examples run here: the README and every page of the docs site.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def small(*args, out, sequences=2, tokens=6):
    """`probe collapse ARGS` on a short input, writing into `out`."""
    return invoke("collapse", *args, "--sequences", sequences, "--tokens", tokens, "--out", out)


def readme_commands(pages: list[Path] = PAGES) -> list[str]:
    """Every `probe ...` line inside the shell code blocks of ``pages``, each once."""
    blocks = [
        block
        for page in pages
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", page.read_text(), flags=re.S)
    ]
    # A command continued over lines with a backslash is one command, as the shell reads it.
    blocks = [re.sub(r"\\\n\s*", " ", block) for block in blocks]
    lines = [line.strip().removeprefix("$ ") for block in blocks for line in block.splitlines()]
    return list(dict.fromkeys(line for line in lines if line.startswith("probe ")))


def test_readme_has_examples():
    commands = readme_commands([README])
    assert any(
        c.startswith("probe collapse bert-base-uncased --no-skip --init random") for c in commands
    )
    assert "probe models" in commands


#: README placeholders for the user's own folders -> the tiny family whose folder stands in.
PLACEHOLDERS = {
    "./tiny-llama": "llama",
    "./tiny-qwen3": "qwen3",
    "./my-vit": "vit",
    "./my-starcoder2": "starcoder2",
}
#: Hub checkpoints whose pretrained weights an offline test cannot have -> the tiny family.
HUB_WEIGHTS = {"bigcode/starcoder2-3b": "starcoder2"}
#: Real-size hub ids in README examples -> the tiny family run instead unless PROBE_SLOW=1
#: (at random init each is minutes of CPU just to build).
REAL_SIZE = {"meta-llama/Llama-3.2-1B": "llama", "google/vit-base-patch16-224": "vit"}
#: An example over several real-size configs at random init: each builds a base-size model
#: (seconds of CPU apiece), so a short run measures their tiny families in the same command;
#: the single-model examples above still build each of these configs as written.
SEVERAL = {"bert-base-uncased": "bert", "albert-base-v2": "albert", "xlnet-base-cased": "xlnet",
           "gpt2": "gpt2"}  # fmt: skip
#: Config overrides that keep an example's own ``--set`` (a deeper GPT-2) but narrow its width
#: in a short run.
NARROW = {"gpt2": ["--set", "n_embd=64", "--set", "n_head=4"]}
#: The same for a sweep, whose every point builds the model anew (a 32-layer bert-base at
#: random init: a minute apiece of draws, constants and forwards).  A collapse example keeps
#: bert's width: 48 narrow layers of SAN/LN-affine underflow to zero in float32.
NARROW_SWEEP = {
    **NARROW,
    "bert-base-uncased": ["--set", "hidden_size=64", "--set", "num_attention_heads=4",
                          "--set", "intermediate_size=128"],
}  # fmt: skip
#: Hub ids the examples read at a revision -> the tiny family a local HuggingFace cache made
#: here holds at that revision (offline, the hub's files cannot be had).
HUB_REVISIONS = {"EleutherAI/pythia-160m": "gpt-neox"}


def _hub_cache(root: Path, hub_id: str, revision: str, folder: str, monkeypatch) -> None:
    """A HuggingFace cache under ``root`` holding ``folder``'s files as ``hub_id`` at
    ``revision``, read offline (the cache's own layout: refs/<revision> names a snapshot)."""
    import huggingface_hub.constants

    from probe.loading import hub

    repo = root / ("models--" + hub_id.replace("/", "--"))
    commit = "5" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / revision).write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)


def _images(folder: Path) -> Path:
    import numpy as np
    from PIL import Image

    folder.mkdir()
    for i in range(2):
        pixels = np.random.default_rng(i).integers(0, 256, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"photo{i}.png")
    return folder


@pytest.fixture(scope="module")
def readme_results(tmp_path_factory) -> Path:
    """probe-reports/ with the two results the README's compare and report examples name,
    made once for them all (GPT-2 at random init takes seconds to build)."""
    folder = tmp_path_factory.mktemp("readme-results")
    here = os.getcwd()
    os.chdir(folder)
    try:
        for model, init in (("minilm", "pretrained"), ("gpt2", "random")):
            done = invoke("collapse", model, "--init", init, "--sequences", "2", "--tokens", "8")
            assert done.exit_code == 0, done.output
    finally:
        os.chdir(here)
    return folder / "probe-reports"


@pytest.mark.parametrize("command", readme_commands())
def test_readme_example(
    command, tmp_path, tiny_bert_with_tokenizer, tiny_family_folder, monkeypatch, request
):
    """Each example of the README and the docs pages runs as written (short inputs unless
    PROBE_SLOW=1)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(
        "attention loses rank with depth, " * 200, encoding="utf-8"
    )
    _images(tmp_path / "photos")
    args = shlex.split(command, comments=True)[1:]
    args = [tiny_bert_with_tokenizer if a == "./my-checkpoint" else a for a in args]
    args = [tiny_family_folder(PLACEHOLDERS[a]) if a in PLACEHOLDERS else a for a in args]
    args = [tiny_family_folder(HUB_WEIGHTS[a]) if a in HUB_WEIGHTS else a for a in args]
    if "--revision" in args:
        for name in set(args) & set(HUB_REVISIONS):
            revision = args[args.index("--revision") + 1]
            folder = tiny_family_folder(HUB_REVISIONS[name])
            _hub_cache(tmp_path / "hub", name, revision, folder, monkeypatch)
    if not SLOW:
        args = [tiny_family_folder(REAL_SIZE[a]) if a in REAL_SIZE else a for a in args]
        if args[0] == "collapse" and len(set(args) & set(SEVERAL)) > 1:
            tiny = request.getfixturevalue("tiny_folders")
            args = [tiny[SEVERAL[a]] if a in SEVERAL else a for a in args]
        if "--set" in args:
            narrow = NARROW_SWEEP if args[0] == "sweep" else NARROW
            args += [word for name in set(args) & set(narrow) for word in narrow[name]]
    if args[0] in ("collapse", "attention") and not SLOW:
        args += ["--sequences", "2", "--tokens", "16"]
    if args[0] == "sweep" and not SLOW:  # short sizes, unless the sweep sweeps them
        args += [word for size in ("sequences", "tokens") if f"--{size}" not in args
                 for word in (f"--{size}", "2" if size == "sequences" else "16")]  # fmt: skip
    if args[0] == "paths" and "--sample" in args and "--samples" in args and not SLOW:
        # The paper's notebook setting (BERT-base, MiniLM): the same command on fewer,
        # shorter sequences (the last --sequences/--tokens win) keeps the suite's time.
        args += ["--sequences", "4", "--tokens", "32"]
    if args[0] in ("compare", "report"):  # the results the README's examples name
        shutil.copytree(request.getfixturevalue("readme_results"), tmp_path / "probe-reports")
    result = invoke(*args)
    assert result.exit_code == 0, result.output


def test_collapse_prints_table_and_writes_files(tiny_folders, tmp_path):
    result = small(
        tiny_folders["bert"],
        "--init",
        "random",
        "--no-skip",
        "--no-mlp",
        out=tmp_path,
        sequences=3,
        tokens=8,
    )
    assert result.exit_code == 0, result.output
    assert "random · relative residual (l1inf, residual to the mean)" in result.output
    assert "mean ± std over 3 sequences" in result.output
    assert "SAN" in result.output and "transformer" not in result.output
    (nc,) = tmp_path.glob("collapse-tiny-bert-random-float32-*.nc")
    assert re.fullmatch(r"collapse-tiny-bert-random-float32-[0-9a-f]{8}\.nc", nc.name)
    assert f"result: {nc}" in result.output.replace("\n", "")
    ds = probe.open_result(nc)
    assert list(ds.variant.values) == ["SAN"] and list(ds.init.values) == ["random"]
    assert nc.stem.endswith(ds.attrs["settings_id"])
    assert ds.attrs["command"].startswith(
        f"probe collapse {tiny_folders['bert']} --init random --no-skip"
    )
    assert nc.with_suffix(".html").is_file()
    assert (tmp_path / "index.html").is_file()


@pytest.mark.parametrize(
    "flags, variants",
    [
        ([], ["SAN", "SAN+MLP", "SAN+skip", "transformer"]),
        (["--no-skip"], ["SAN+MLP"]),
        (["--no-mlp"], ["SAN+skip"]),
        (["--variants", "transformer,SAN"], ["SAN", "transformer"]),
    ],
)
def test_variant_selection(flags, variants, tiny_folders, tmp_path):
    result = small(tiny_folders["gpt2"], "--init", "random", *flags, out=tmp_path)
    assert result.exit_code == 0, result.output
    ds = probe.open_result(next(tmp_path.glob("*.nc")))
    assert list(ds.variant.values) == variants


def test_metric_norm_fit_and_float64(tiny_folders, tmp_path):
    result = small(
        tiny_folders["xlnet"],
        "--init",
        "both",
        "--metric",
        "effective-rank",
        "--dtype",
        "float64",
        out=tmp_path,
    )
    assert result.exit_code == 0, result.output
    assert (
        "pretrained · effective rank" in result.output
        and "random · effective rank" in result.output
    )
    (nc,) = tmp_path.glob("collapse-tiny-xlnet-pretrained-random-float64-*.nc")
    ds = probe.open_result(nc)
    assert ds.attrs["dtype"] == "float64"
    result = small(
        tiny_folders["xlnet"],
        "--init",
        "random",
        "--norm",
        "fro",
        "--fit",
        "svd",
        out=tmp_path,
    )
    assert "relative residual (fro, residual to the svd)" in result.output


def test_models_lists_families_and_configs():
    result = invoke("models")
    assert result.exit_code == 0
    for word in (
        "bert",
        "albert",
        "xlnet",
        "gpt2",
        "bert-base-uncased",
        "albert-base-v2",
        "xlnet-base-cased",
        "minilm",
    ):
        assert word in result.output


def test_out_is_a_file(tmp_path, tiny_folders):
    target = tmp_path / "file"
    target.write_text("x")
    result = invoke("collapse", tiny_folders["bert"], "--out", target)
    assert result.exit_code == 2 and "is a file" in result.output


def _two_results(folder: Path, tiny_folders) -> list[Path]:
    for family in ("bert", "gpt2"):
        result = small(tiny_folders[family], "--init", "random", out=folder)
        assert result.exit_code == 0, result.output
    return sorted(folder.glob("*.nc"))


def test_collapse_of_several_models_writes_a_comparison(tiny_folders, tmp_path):
    result = small(
        tiny_folders["bert"],
        tiny_folders["albert"],
        "--init",
        "random",
        out=tmp_path,
    )
    assert result.exit_code == 0, result.output
    (comparison,) = tmp_path.glob("comparison-tiny-bert-tiny-albert-*.html")
    (albert,) = tmp_path.glob("collapse-tiny-albert-random-float32-*.html")
    index = (tmp_path / "index.html").read_text()
    assert comparison.name in index and albert.name in index


def test_compare_and_report_commands(tiny_folders, tmp_path, monkeypatch):
    files = _two_results(tmp_path, tiny_folders)
    result = invoke("compare", *files, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert len(list(tmp_path.glob("comparison-tiny-bert-tiny-gpt2-*.html"))) == 1

    monkeypatch.setenv("COLUMNS", "80")
    # The folder by a relative name: the first line names it, and the width asserted is the
    # table's, whatever the length of the test's temporary folder (longer under xdist).
    monkeypatch.chdir(tmp_path)
    listed = invoke("report", "list", ".")
    assert listed.exit_code == 0 and "tiny-gpt2" in listed.output and "comparison" in listed.output
    assert max(len(line) for line in listed.output.splitlines()) <= 80, listed.output
    gpt2 = probe.open_result(next(f for f in files if "gpt2" in f.name))
    assert gpt2.attrs["settings_id"] in listed.output and "2x6 · seed 0" in listed.output

    (gpt2_nc,) = tmp_path.glob("collapse-tiny-gpt2-random-float32-*.nc")
    gpt2_nc.with_suffix(".html").unlink()
    rebuilt = invoke("report", "build", gpt2_nc)
    assert rebuilt.exit_code == 0, rebuilt.output
    html = gpt2_nc.with_suffix(".html").read_text()
    assert f'href="{gpt2_nc.name}"' in html

    opened = []
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    result = invoke("report", "open", "latest", "--out", tmp_path)
    assert result.exit_code == 0 and opened and opened[0].startswith("file://")
    newest = result.output.strip().splitlines()[0]
    assert Path(newest).name.startswith("comparison-")  # written last, listed first

    monkeypatch.delenv("DISPLAY")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    (bert_nc,) = tmp_path.glob("collapse-tiny-bert-random-float32-*.nc")
    result = invoke("report", "open", bert_nc)
    assert result.exit_code == 0 and "no browser here" in result.output and len(opened) == 1


def test_collapse_streams_its_results_to_disk(tiny_folders, tmp_path, monkeypatch):
    # The command never holds the per-sequence arrays of a run: every batch is appended to
    # the result file as it comes (an unlimited, chunked sequence dimension), which is then
    # moved into place beside its report; the numbers are those of an in-memory run.
    from probe.analyses import collapse

    seen = []
    real = collapse.execute

    def spy(plan, progress=None, stream_to=None):
        seen.append(stream_to)
        return real(plan, progress, stream_to)

    monkeypatch.setattr(collapse, "execute", spy)
    args = (tiny_folders["gpt2"], "--init", "random", "--batch-size", "2")
    result = small(*args, out=tmp_path, sequences=5, tokens=6)
    assert result.exit_code == 0, result.output
    assert len(seen) == 1 and seen[0] is not None
    (nc,) = tmp_path.glob("collapse-*.nc")
    import h5netcdf

    with h5netcdf.File(nc, "r") as f:
        assert "sequence" in f.dimensions and f.dimensions["sequence"].isunlimited()
    in_memory = collapse.run(
        tiny_folders["gpt2"], init="random", sequences=5, tokens=6, batch_size=2
    )
    streamed = probe.open_result(nc)
    for name in in_memory.data_vars:
        np.testing.assert_array_equal(streamed[name].values, in_memory[name].values)
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_metrics_option_chooses_what_is_computed(tiny_folders, tmp_path):
    args = (tiny_folders["bert"], "--init", "random", "--variants", "SAN")
    result = small(*args, "--metrics", "stable-rank", "--metric", "stable-rank", out=tmp_path)
    assert result.exit_code == 0, result.output
    assert "random · stable rank" in result.output
    (nc,) = tmp_path.glob("collapse-*.nc")
    some = probe.open_result(nc)
    # The relative residual is always computed (the report is built on it), and mu, its
    # numerator, with it.  (The theory panel's variables have no sequence dimension: they are not metrics; the
    # token ids that ran are kept beside them.)
    measured = {name for name in some.data_vars if "sequence" in some[name].dims}
    assert measured == {"relative_residual", "mu", "stable_rank", "input_ids"}
    assert some.attrs["metrics"] == "relative_residual,stable_rank"
    assert "stable rank: exact" in some.attrs["metrics_note"]
    assert "--metrics stable-rank" in some.attrs["command"]
    assert "Metrics computed: relative residual" in nc.with_suffix(".html").read_text()
    full_dir = tmp_path / "full"
    assert small(*args, "--effective-rank", "estimate", out=full_dir).exit_code == 0
    (full_nc,) = full_dir.glob("collapse-*.nc")
    full = probe.open_result(full_nc)
    # 6 tokens: too few for the estimate's probes (metrics.ESTIMATE_FROM), so it is exact
    assert "effective rank: exact" in full.attrs["metrics_note"]
    assert "--effective-rank estimate" in full.attrs["command"]
    wide = (
        "gpt2",
        "--init",
        "random",
        "--set",
        "n_layer=1",
        "--set",
        "n_embd=64",
        "--set",
        "n_head=4",
    )
    wide_dir = tmp_path / "wide"
    done = small(*wide, "--effective-rank", "estimate", out=wide_dir, sequences=1, tokens=56)
    assert done.exit_code == 0, done.output
    (wide_nc,) = wide_dir.glob("collapse-*.nc")
    assert "stochastic Lanczos quadrature" in probe.open_result(wide_nc).attrs["metrics_note"]
    for name in some.data_vars:  # a subset computes the same numbers
        np.testing.assert_allclose(some[name], full[name], rtol=1e-12, atol=1e-15)
    # --metric names one not computed: the table falls back to the first computed one.
    result = small(*args, "--metrics", "cosine-similarity", out=tmp_path / "fallback")
    assert result.exit_code == 0 and "random · relative residual" in result.output
    for bad, words in (("rank", "unknown metric rank"), (",", "no metric given")):
        result = small(*args, "--metrics", bad, out=tmp_path / "bad")
        assert result.exit_code == 2, result.output
        assert f"probe: error: {words}; --metrics takes all or a comma list" in result.output
        assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
