"""The request's side of a result's identity: a result names the checkpoint it measured, and inputs that are
well formed but mean something else are read as what they are or refused in one line.

Table-driven; every fixture is built here: tiny ``save_pretrained`` folders, images of each
PIL mode, corrupt tokenizer files.
"""

from __future__ import annotations

import copy
import gc
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

import probe
from cli.app import app
from probe.analyses import collapse
from probe.errors import ProbeError
from probe.loading.identity import folder_fingerprint
from tests.reference.tiny import tiny_model, tiny_spec_config

SMALL = {"sequences": 2, "tokens": 8, "variants": "SAN", "metrics": "relative_residual"}
CLI_SMALL = ["--sequences", "2", "--tokens", "8", "--variants", "SAN", "--metrics",
             "relative-residual"]  # fmt: skip


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _save(folder: Path, seed: int, family: str = "gpt2") -> Path:
    tiny_model(family, seed=seed, dtype=torch.float32).save_pretrained(folder)
    return folder


# --- 1. A result's identity is the checkpoint's -------------------------------------------


def test_same_relative_name_different_weights_gives_two_files(tmp_path, monkeypatch):
    from probe.reports.naming import report_name

    for project, seed in (("a", 1), ("b", 2)):
        _save(tmp_path / project / "m", seed)
    results = {}
    for project in ("a", "b"):
        monkeypatch.chdir(tmp_path / project)
        results[project] = collapse.run("./m", init="pretrained", **SMALL)
    a, b = results["a"], results["b"]
    assert a.attrs["model"] == b.attrs["model"] == "./m"
    assert report_name(a) != report_name(b)  # the file names the CLI writes
    assert a.attrs["checkpoint_path"] == str((tmp_path / "a" / "m").resolve())
    assert b.attrs["checkpoint_path"] == str((tmp_path / "b" / "m").resolve())
    assert a.attrs["checkpoint_fingerprint"] != b.attrs["checkpoint_fingerprint"]
    assert not np.allclose(a.relative_residual.values, b.relative_residual.values)


def test_a_folder_retrained_in_place_gets_a_new_id_and_a_copy_keeps_its_fingerprint(tmp_path):
    folder = _save(tmp_path / "m", 1)
    before = collapse.run(str(folder), init="pretrained", **SMALL).attrs
    same = collapse.run(str(folder.resolve()), init="pretrained", **SMALL).attrs
    assert same["settings_id"] == before["settings_id"]  # the folder however it is typed
    _save(folder, 2)  # retrained: same files, same shapes, other values
    after = collapse.run(str(folder), init="pretrained", **SMALL).attrs
    assert after["settings_id"] != before["settings_id"]
    assert after["checkpoint_fingerprint"] != before["checkpoint_fingerprint"]
    copy = shutil.copytree(folder, tmp_path / "copy")  # new times, same contents
    assert folder_fingerprint(copy) == after["checkpoint_fingerprint"]


def test_two_modules_of_one_class_with_other_weights_get_two_ids():
    from probe.loading.identity import module_fingerprint

    first, second = (tiny_model("gpt2", seed=seed, dtype=torch.float32) for seed in (1, 2))
    a = collapse.run(first, **SMALL).attrs
    b = collapse.run(second, **SMALL).attrs
    again = collapse.run(copy.deepcopy(first), **SMALL).attrs
    assert a["model"] == b["model"]  # the class name: all a module says of itself
    assert a["settings_id"] != b["settings_id"]
    assert a["checkpoint_fingerprint"] != b["checkpoint_fingerprint"]
    assert again["settings_id"] == a["settings_id"]  # the same weights, another object
    # A change of any one entry of any tensor is seen: every byte is hashed.
    state = [t for t in first.state_dict().values() if t.numel() > 1]
    for tensor in (state[0], state[len(state) // 2], state[-1]):
        for at in (0, tensor.numel() // 3, tensor.numel() - 1):
            before = module_fingerprint(first)
            with torch.no_grad():
                tensor.view(-1)[at] += 1.0
            assert module_fingerprint(first) != before


@pytest.mark.parametrize(
    "edit",
    [
        lambda f: (f / "config.json").write_text((f / "config.json").read_text() + " "),
        lambda f: (f / "tokenizer.json").write_text("{}"),
        lambda f: (f / "model.safetensors").write_bytes(_flip_last(f / "model.safetensors")),
    ],
    ids=["config", "a new file", "one weight byte"],
)
def test_the_fingerprint_sees_every_file_of_the_folder(tmp_path, edit):
    folder = _save(tmp_path / "m", 1)
    before = folder_fingerprint(folder)
    edit(folder)
    assert folder_fingerprint(folder) != before


def _flip_last(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    return bytes(data)


#: A weight file past the size a sampled key would hash whole (64 MiB), written once.
LARGE = 65 * 2**20


@pytest.fixture(scope="module")
def large_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("large")
    (folder / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(LARGE))
    return folder, folder_fingerprint(folder)


@settings(max_examples=12, deadline=None)
@given(at=st.integers(0, LARGE - 1), bit=st.integers(0, 7))
def test_any_byte_of_a_large_weight_file_changes_the_fingerprint(large_folder, at, bit):
    """Any byte anywhere in a 65 MiB weight file, one bit flipped in place: a new
    fingerprint (the bytes a sample would skip count as much as the others); flipped back,
    the old one."""
    folder, before = large_folder
    with (folder / "model.safetensors").open("r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)[0]
        for value in (byte ^ (1 << bit), byte):
            handle.seek(at)
            handle.write(bytes([value]))
            handle.flush()
            assert (folder_fingerprint(folder) == before) == (value == byte)


def test_the_fingerprint_is_sha256_of_every_byte(tmp_path):
    """The key written out by hand with hashlib: per file in name order, its name, size and
    the sha256 of its bytes."""
    import hashlib

    folder = _save(tmp_path / "m", 1)
    hasher = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        hasher.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        hasher.update(hashlib.sha256(path.read_bytes()).digest())
    assert folder_fingerprint(folder) == hasher.hexdigest()


@pytest.mark.parametrize(
    ("name", "init", "expected"),
    [
        ("gpt2-tiny", "pretrained", "fe3bb3d3"),
        ("fastformer-tiny", "random", "74d1e383"),
    ],
)
def test_probe_s_own_checkpoints_keep_the_ids_they_had(name, init, expected):
    # Pinned ids: names probe ships are identified by the name alone.
    ds = collapse.run(name, init=init, **SMALL)
    assert ds.attrs["settings_id"] == expected
    assert not [key for key in ds.attrs if key.startswith("checkpoint")]


# --- 2. Offloading never reuses another run's weights ------------------------------------


def _spread(folder, offload):
    whole = probe.load(folder, init="pretrained", dtype="float64")
    size = sum(p.numel() * p.element_size() for p in whole.model.parameters())
    return probe.load(
        folder,
        init="pretrained",
        dtype="float64",
        device_map="auto",
        max_memory={"cpu": int(0.6 * size)},
        offload_folder=offload,
    )


def test_two_models_offloaded_into_one_folder_each_keep_their_own_weights(tmp_path):
    a, b = _save(tmp_path / "a", 1), _save(tmp_path / "b", 2)
    offload = tmp_path / "offload"
    (offload / "keep").mkdir(parents=True)  # the user's own files stay
    spread_b = _spread(str(b), offload)
    spread_a = _spread(str(a), offload)
    assert any(p.device.type == "meta" for p in spread_a.model.parameters())  # on disk
    whole_a = collapse.run(
        probe.load(str(a), init="pretrained", dtype="float64"), init="pretrained", **SMALL
    )
    measured = collapse.run(spread_a, init="pretrained", **SMALL)
    xr.testing.assert_identical(measured.relative_residual, whole_a.relative_residual)
    assert len(list(offload.glob("probe-offload-*"))) == 2  # one private folder each
    del spread_a, spread_b, measured
    gc.collect()
    assert sorted(p.name for p in offload.iterdir()) == ["keep"]


def test_the_offload_folder_goes_however_the_run_ends(tmp_path):
    folder = _save(tmp_path / "m", 1)
    offload = tmp_path / "made-by-probe"
    script = (
        "import os, probe; "
        f"whole = probe.load({str(folder)!r}, init='pretrained'); "
        "size = sum(p.numel() * p.element_size() for p in whole.model.parameters()); "
        f"m = probe.load({str(folder)!r}, init='pretrained', device_map='auto', "
        f"max_memory={{'cpu': int(0.6 * size)}}, offload_folder={str(offload)!r}); "
        f"assert os.listdir({str(offload)!r}); raise KeyboardInterrupt"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "KeyboardInterrupt" in done.stderr and "AssertionError" not in done.stderr
    assert not offload.exists()  # its private folder, then the folder probe made, are gone


def test_a_failed_dispatch_leaves_no_offload_folder(tmp_path, monkeypatch):
    import accelerate

    def broken(*args, **kwargs):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(accelerate, "dispatch_model", broken)
    offload = tmp_path / "offload"
    offload.mkdir()
    with pytest.raises(ProbeError, match="cannot spread the model.*disk gone"):
        _spread(str(_save(tmp_path / "m", 1)), offload)
    assert list(offload.iterdir()) == []


# --- 3. Images are read as what they are --------------------------------------------------


def _vit_folder(tmp_path, channels=3) -> str:
    config = tiny_spec_config("vit")
    config.num_channels = channels
    torch.manual_seed(0)
    from transformers import ViTModel

    folder = tmp_path / f"vit{channels}"
    ViTModel(config).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize(
    ("make", "gray"),
    [
        (lambda: Image.fromarray(np.full((16, 16), 32768, np.uint16)), 32768 / 65535),
        (lambda: Image.fromarray(np.full((16, 16), 16384, np.int32)), 16384 / 65535),
        (lambda: Image.fromarray(np.full((16, 16), 0.25, np.float32)), 0.25),
        (lambda: Image.new("1", (16, 16), 1), 1.0),
        (lambda: Image.new("L", (16, 16), 64), 64 / 255),
        (lambda: Image.new("LA", (16, 16), (200, 255)), 200 / 255),
        (lambda: Image.new("RGBA", (16, 16), (100, 100, 100, 255)), 100 / 255),
        (
            lambda: Image.new("RGB", (16, 16), (30, 30, 30)).convert(
                "P", palette=Image.Palette.ADAPTIVE
            ),
            30 / 255,
        ),
        (lambda: Image.new("CMYK", (16, 16), (0, 0, 0, 191)), 64 / 255),
    ],
    ids=["I;16", "I", "F", "1", "L", "LA-opaque", "RGBA-opaque", "P", "CMYK"],
)
def test_each_image_mode_keeps_its_gray_level(tmp_path, make, gray):
    from probe.requests.inputs import _open_image

    image = make()
    path = tmp_path / ("x.tif" if image.mode in ("F", "I", "CMYK") else "x.png")
    image.save(path)
    for channels in (1, 3):
        opened = np.asarray(_open_image(path, channels), dtype=np.float64) / 255
        assert opened.shape[-1:] == ((3,) if channels == 3 else (16,))
        # 8-bit output: within half a step of the true level.
        assert np.abs(opened - gray).max() <= 0.5 / 255 + 1e-12, (image.mode, opened.max())


def test_a_16_bit_gray_image_is_half_gray_through_the_model_not_white(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(np.full((40, 40), 65535 // 2, np.uint16)).save(folder / "half.png")
    vit = probe.load(_vit_folder(tmp_path), init="random")
    from probe.requests.inputs import make_image_inputs

    pixels = make_image_inputs(
        vit.config, vit.image_processor, images=folder, sequences=1
    ).input_ids
    # ViT's processor: (v/255 - 0.5)/0.5; 65535/2 scales to 127.5 -> 128 (or 127): about 0.
    assert pixels.abs().max().item() <= 1 / 255 + 1e-6


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Image.new("RGBA", (8, 8), (1, 2, 3, 0)), "transparent pixels"),
        (lambda: Image.new("LA", (8, 8), (1, 128)), "transparent pixels"),
        (lambda: Image.fromarray(np.full((8, 8), 2.0, np.float32)), r"outside 0\.\.1"),
        (lambda: Image.fromarray(np.full((8, 8), -5, np.int32)), r"outside 0\.\.65535"),
    ],
    ids=["RGBA", "LA", "F>1", "I<0"],
)
def test_images_that_cannot_be_read_faithfully_are_refused_in_one_line(tmp_path, make, message):
    from probe.requests.inputs import _open_image

    image = make()
    path = tmp_path / ("x.tif" if image.mode in ("F", "I") else "x.png")
    image.save(path)
    with pytest.raises(ProbeError, match=message) as caught:
        _open_image(path)
    assert "\n" not in str(caught.value)


def test_a_decompression_bomb_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    Image.new("L", (64, 64)).save(path)
    from probe.requests.inputs import _open_image

    for limit in (64 * 64 - 1, 64 * 64 // 2 - 1):  # PIL's warning, then its error
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
        with pytest.raises(ProbeError, match="decompression bomb"):
            _open_image(path)


@pytest.mark.parametrize("channels", [1, 4])
def test_a_vit_with_other_channel_counts_works_or_is_refused_in_one_line(tmp_path, channels):
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (40, 40), (10, 200, 30)).save(folder / "a.png")
    vit = _vit_folder(tmp_path, channels)
    done = invoke("collapse", vit, "--init", "random", "--images", folder, "--sequences", "1",
                  "--variants", "SAN", "--metrics", "relative-residual", "-q", "--out",
                  tmp_path / "out")  # fmt: skip
    if channels == 1:
        assert done.exit_code == 0, done.output
        (nc,) = (tmp_path / "out").glob("*.nc")
        assert probe.open_result(nc).attrs["inputs"] == "images"
    else:
        assert done.exit_code == 2 and "num_channels" in done.output
        assert len(done.output.strip().splitlines()) == 1, done.output


# --- 4. Each family's real limits ---------------------------------------------------------


def _roberta_like(model_type: str, pad: int):
    from transformers import AutoConfig

    base = tiny_spec_config("roberta").to_dict()
    base.update(model_type=model_type, pad_token_id=pad, max_position_embeddings=20)
    for key in ("architectures", "transformers_version", "_name_or_path"):
        base.pop(key, None)
    return AutoConfig.for_model(**base)


@pytest.mark.parametrize(
    ("model_type", "pad"), [("roberta", 0), ("roberta", 1), ("xlm-roberta", 1), ("camembert", 1)]
)
def test_roberta_positions_start_after_padding(model_type, pad):
    from transformers import AutoModel

    config = _roberta_like(model_type, pad)
    limit = 20 - pad - 1
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    probed = probe.wrap(model)
    assert probed.adapter.max_tokens(config) == limit
    ids = torch.full((1, limit + 1), pad + 2)
    with pytest.raises((IndexError, RuntimeError), match="out of"):  # the limit is real
        model(input_ids=ids)
    assert len(probe.hidden_states(probed, ids[:, :limit])) == probed.n_layers + 1
    with pytest.raises(ProbeError, match=f"at most {limit} tokens"):
        probe.hidden_states(probed, ids)


def test_roberta_limit_on_the_command_line_is_one_line_before_any_work(tmp_path):
    from transformers import RobertaModel

    config = _roberta_like("roberta", 1)
    torch.manual_seed(0)
    RobertaModel(config).save_pretrained(tmp_path / "rob")
    done = invoke("collapse", tmp_path / "rob", "--init", "random", "--tokens", "19",
                  "--sequences", "1", "--out", tmp_path / "out")  # fmt: skip
    assert done.exit_code == 2 and "at most 18 tokens" in done.output, done.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("family", "edit", "limit"),
    [
        ("bloom", {}, None),
        ("falcon", {"alibi": True}, None),
        ("falcon", {"alibi": False}, 2048),
        ("llama", {}, 64),
        (
            "llama",
            {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}},
            256,
        ),
        (
            "llama",
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
            128,
        ),
        ("bert", {}, 64),
        ("t5", {}, None),
    ],
)
def test_position_limits_follow_the_family(family, edit, limit):
    from probe.models import adapter_for

    config = tiny_spec_config(family)
    for key, value in edit.items():
        setattr(config, key, value)
    assert adapter_for(config.model_type).max_tokens(config) == limit


# --- 5. Conflicting options are refused, not resolved silently ---------------------------


def test_metric_outside_metrics_is_refused(tmp_path):
    folder = _save(tmp_path / "m", 1)
    done = invoke("collapse", folder, "--init", "random", "--metric", "effective-rank",
                  "--metrics", "relative-residual", "--out", tmp_path / "out")  # fmt: skip
    assert done.exit_code == 2, done.output
    assert "--metric effective-rank is not among --metrics" in done.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("held", ["module", "probed"])
def test_an_explicit_dtype_on_a_loaded_model_is_honoured_on_a_copy(tmp_path, held):
    module = tiny_model("gpt2", seed=1, dtype=torch.float32)
    source = module if held == "module" else probe.wrap(module)
    ds = collapse.run(source, init="pretrained", dtype="float64", **SMALL)
    assert ds.attrs["dtype"] == "float64"
    assert next(module.parameters()).dtype == torch.float32  # the caller's is untouched
    plain = collapse.run(copy.deepcopy(module).double(), init="pretrained", **SMALL)
    np.testing.assert_array_equal(ds.relative_residual.values, plain.relative_residual.values)


# --- 6. A corrupt tokenizer is one line ---------------------------------------------------


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_corrupt_tokenizer_is_refused_not_replaced_by_random_ids(
    tmp_path, tiny_bert_with_tokenizer, name
):
    folder = shutil.copytree(tiny_bert_with_tokenizer, tmp_path / "m")
    (folder / name).write_text("{not json")
    with pytest.raises(ProbeError, match=f"cannot read .*{name}"):
        probe.load(str(folder), init="random")
    done = invoke("collapse", folder, "--init", "random", *CLI_SMALL, "--out", tmp_path / "out")
    assert done.exit_code == 2 and "cannot read" in done.output, done.output
    assert len(done.output.strip().splitlines()) == 1


# --- 7. The library speaks ProbeError -----------------------------------------------------


@pytest.fixture(scope="module")
def wrapped():
    return probe.wrap(tiny_model("gpt2", seed=1, dtype=torch.float32))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: probe.wrap(w), "already a ProbedModel"),
        (lambda w: probe.wrap("gpt2"), "wrap takes an nn.Module"),
        (lambda w: probe.wrap(torch.nn.Identity()), "needs a HuggingFace model"),
        (lambda w: probe.hidden_states(w, torch.tensor([[1, 10**6]])), r"must lie in \[0, 80\)"),
        (lambda w: probe.hidden_states(w, torch.tensor([[-1, 2]])), r"must lie in \[0, 80\)"),
        (lambda w: probe.hidden_states(w, torch.ones(1, 3)), "integer token ids"),
        (lambda w: probe.hidden_states(w, torch.ones(3, dtype=torch.long)), "integer token ids"),
        (lambda w: probe.hidden_states(w, [[1, 2]]), "must be a tensor"),
        (lambda w: probe.hidden_states(w, torch.ones(1, 65, dtype=torch.long)), "at most 64"),
        (
            lambda w: probe.hidden_states(
                w, torch.ones(1, 3, dtype=torch.long), attention_mask=torch.ones(2)
            ),
            "`attention_mask` must have the shape",
        ),
        (lambda w: probe.layer_values(w.model, torch.ones(1, 3)), "must be a ProbedModel"),
        (lambda w: probe.open_result(5), "`path` must be a file path"),
        (lambda w: collapse.run(w, init="pretrained", variants=5), "`variants` takes"),
        (lambda w: collapse.run(w, init="pretrained", metrics=5), "`metrics` takes"),
    ],
)
def test_public_functions_refuse_bad_inputs_in_one_line(wrapped, call, message):
    with pytest.raises(ProbeError, match=message) as caught:
        call(wrapped)
    assert "\n" not in str(caught.value)


# --- 8. A degenerate model leaves stderr clean --------------------------------------------


def test_a_llama_with_one_token_gives_no_numpy_warning(tmp_path):
    config = tiny_spec_config("llama")
    config.vocab_size, config.pad_token_id = 1, 0
    config.bos_token_id = config.eos_token_id = None
    torch.manual_seed(0)
    from transformers import LlamaModel

    # One token, the padding one: X_0 = 0, so r_0 = 0/0 and the bound 0; no ratio exists,
    # and the run says so in one line before any statistic (no numpy warning on the way).
    with warnings.catch_warnings(), pytest.raises(ProbeError) as caught:
        warnings.simplefilter("error", RuntimeWarning)
        collapse.run(LlamaModel(config), init="pretrained", **SMALL)
    assert "layer 0's token representations are all zero" in str(caught.value)
    assert "\n" not in str(caught.value)
