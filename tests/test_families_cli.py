"""The walker families through the command line: collapse, check, models, images, comparison."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import probe
from probe.cli.app import app
from probe.files.results import open_result
from probe.models import ADAPTERS, SpecAdapter
from probe.models.family import zero
from tests.reference.tiny import tiny_model, tiny_spec_model

runner = CliRunner()
SPEC_FAMILIES = sorted(name for name, a in ADAPTERS.items() if isinstance(a, SpecAdapter))


def _folder(tmp_path_factory, name: str) -> str:
    folder = tmp_path_factory.mktemp("fam") / f"tiny-{name}"
    model = (
        tiny_model(name, seed=1, dtype=torch.float32)
        if name in ("bert", "gpt2")
        else tiny_spec_model(name, seed=1, dtype=torch.float32)
    )
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    return {name: _folder(tmp_path_factory, name) for name in SPEC_FAMILIES}


@pytest.mark.parametrize("name", SPEC_FAMILIES)
def test_collapse_no_skip_on_every_family_folder(name, folders, tmp_path):
    args = ["collapse", folders[name], "--no-skip", "--init", "pretrained", "--sequences", "2"]
    args += ["--tokens", "6", "--out", str(tmp_path), "--quiet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    [nc] = tmp_path.glob("collapse-*.nc")
    ds = open_result(nc)
    assert list(ds.variant.values) == ["SAN+MLP"] and ds.attrs["family"] == name
    assert ds.attrs["spec"].startswith("layers:") and ds.attrs["attention"] == "eager"
    assert np.isfinite(ds.relative_residual.values).all()
    html = nc.with_suffix(".html").read_text()
    assert "as the walker executes it" in html


def test_check_prints_every_identity_and_exits_0(folders):
    result = runner.invoke(app, ["check", folders["llama"]])
    assert result.exit_code == 0, result.output
    # Sixteen rows: the entry, clean, SAN, SAN+skip, the MLP branch; per LayerNorm variant
    # (LN-affine, no-LN) the variant, its SAN, its SAN+skip and their first layer against
    # torch hooks; probe's attention against the model's own; clean again, and the path
    # decomposition's reconstruction (the tiny Llama's head is not tied: no loss row); all
    # exact but the MLP branch's linearity, the attention (the model's own softmax runs in
    # float32) and the reconstruction (float32 RMS norms), which hold to rounding.
    assert result.stdout.count("exactly") + result.stdout.count("to rounding") == 16
    assert result.stdout.count("exactly") >= 13 and "NO" not in result.stdout
    assert "all identities hold" in result.stdout


def test_models_prints_one_familys_spec():
    result = runner.invoke(app, ["models", "gpt-neox"])
    assert result.exit_code == 0, result.output
    assert ":hidden_states_0.output <- mlp_out+branch" in result.stdout
    unknown = runner.invoke(app, ["models", "nope"])
    assert unknown.exit_code == 2 and "no family 'nope'" in unknown.stderr


@pytest.mark.parametrize(
    "broken, says",
    [
        # An edit that lands on the wrong value (the attention's input, not the residual):
        # the layer runs, but the SAN identity no longer holds.
        (zero(":hidden_states_0"), "SAN = branch fails at layer 1"),
        # An operation a transformers release renamed away.
        (zero(":residual_9"), "residual_9"),
        # An operation that moved after the attention: nnsight cannot go back for it.
        (zero(":residual_1"), "OutOfOrderError"),
    ],
)
def test_a_spec_that_no_longer_fits_is_refused_in_one_line(
    broken, says, folders, monkeypatch, tmp_path
):
    adapter = ADAPTERS["llama"]
    steps = (broken, *adapter.spec.steps[1:])
    monkeypatch.setattr(adapter, "spec", dataclasses.replace(adapter.spec, steps=steps))
    with pytest.raises(probe.ProbeError, match="the llama spec does not fit this model"):
        probe.load(folders["llama"])
    result = runner.invoke(app, ["collapse", folders["llama"], "--out", str(tmp_path)])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("probe: error: the llama spec does not fit") and says in line
    assert not list(tmp_path.glob("*.nc"))
    checked = runner.invoke(app, ["check", folders["llama"]])
    assert checked.exit_code == 2 and "NO" in checked.stdout


def _images(folder, count: int = 3):
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i}.png")
    (folder / "readme.txt").write_text("not an image")
    return folder


def test_vit_reads_images_from_a_folder_or_seeded_noise(folders, tmp_path):
    images = _images(tmp_path / "images")
    base = ["collapse", folders["vit"], "--init", "pretrained", "--variants", "SAN", "--quiet"]
    result = runner.invoke(
        app, [*base, "--images", str(images), "--sequences", "all", "--out", str(tmp_path / "i")]
    )
    assert result.exit_code == 0, result.output
    read = open_result(next(iter((tmp_path / "i").glob("*.nc"))))
    assert read.attrs["inputs"] == "images" and read.sizes["sequence"] == 3  # the .txt is not one
    assert read.attrs["text_source"] == str(images) and len(read.attrs["text_sha256"]) == 64
    noise = runner.invoke(app, [*base, "--sequences", "2", "--out", str(tmp_path / "n")])
    assert noise.exit_code == 0, noise.output
    ds = open_result(next(iter((tmp_path / "n").glob("*.nc"))))
    assert ds.attrs["inputs"] == "noise images" and ds.sizes["sequence"] == 2
    tokens = (16 // 4) ** 2 + 1  # 16 patches and [CLS]
    assert ds.attrs["tokens"] == tokens
    again = runner.invoke(app, [*base, "--sequences", "2", "--out", str(tmp_path / "m")])
    assert again.exit_code == 0
    other = open_result(next(iter((tmp_path / "m").glob("*.nc"))))
    assert np.array_equal(ds.relative_residual.values, other.relative_residual.values)


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--images", "{missing}"], "is not a folder"),
        (["--images", "{empty}"], "holds no image files"),
        (["--images", "{broken}"], "cannot read the image"),
        (["--text", "{text}"], "reads images, not text"),
    ],
)
def test_bad_image_input_is_one_line(extra, says, folders, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.png").write_bytes(b"not a png")
    (tmp_path / "t.txt").write_text("some text " * 50)
    names = {
        "missing": tmp_path / "missing",
        "empty": tmp_path / "empty",
        "broken": tmp_path / "broken",
        "text": tmp_path / "t.txt",
    }
    args = [part.format(**{k: str(v) for k, v in names.items()}) for part in extra]
    out = tmp_path / "out"
    result = runner.invoke(app, ["collapse", folders["vit"], *args, "--out", str(out)])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert says in line
    assert not out.exists() or not list(out.glob("*.nc"))


def test_a_text_model_refuses_images(folders, tmp_path):
    images = _images(tmp_path / "images")
    out = str(tmp_path / "out")
    result = runner.invoke(
        app, ["collapse", folders["llama"], "--images", str(images), "--out", out]
    )
    assert result.exit_code == 2 and "reads text, not images" in result.stderr


def test_collapse_over_several_families_opens_with_the_table(folders, tmp_path):
    args = ["collapse", folders["llama"], folders["bert"], folders["gpt-neox"], "--init"]
    args += ["random", "--sequences", "2", "--tokens", "6", "--out", str(tmp_path), "--quiet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "across models" in result.stdout and "order: SAN's fitted order" in result.stdout
    [html] = tmp_path.glob("comparison-*.html")
    text = html.read_text()
    assert text.index('id="families"') < text.index("<figure")  # the first element
    for name in ("llama", "bert", "gpt-neox"):
        assert f"<td>{name}</td>" in text


def test_a_passed_self_test_is_remembered_and_a_changed_spec_is_checked_again(
    folders, monkeypatch, tmp_path
):
    from probe.surgery import self_test as check

    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path / "cache"))
    probed = probe.load(folders["llama"])
    key = check.verified_key(probed)
    assert (tmp_path / "cache" / "verified" / key).exists()
    # A second load of the same architecture does not run the identities again ...
    calls = []
    real = check.identities
    monkeypatch.setattr(check, "identities", lambda p: calls.append(p) or real(p))
    probe.load(folders["llama"])
    assert calls == []
    # ... but another dtype is another key, checked once.
    probe.load(folders["llama"], dtype="float64")
    assert len(calls) == 1
    # A spec that changed (an edit now lands on the attention's input) is checked again and
    # refused, whatever passed before.
    adapter = ADAPTERS["llama"]
    steps = (zero(":hidden_states_0"), *adapter.spec.steps[1:])
    monkeypatch.setattr(adapter, "spec", dataclasses.replace(adapter.spec, steps=steps))
    with pytest.raises(probe.ProbeError, match="the llama spec does not fit this model"):
        probe.load(folders["llama"])
    assert len(calls) == 2
