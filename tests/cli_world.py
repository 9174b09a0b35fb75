"""A folder of inputs, good and hostile, for every kind of value the command line takes.

The fuzzer (``tests/test_fuzz_cli.py``) and the fault tests (``tests/test_faults.py``)
draw paths from here by the kind of an option's domain (``cli.domains``): model
folders (tiny and healthy, or with NaN weights, missing tensors, a broken or hostile
config), texts (UTF-8, empty, Latin-1, UTF-16, binary), folders of images (good, damaged,
none), result files of every analysis
(and damaged, foreign and fake ones), folders written by ``probe fastformer train``,
and the special files of the system (a fifo, /dev/null, /proc).  ``copy_world`` gives
each command line a private copy (hard links: every probe write is a rename, so the
originals are never touched).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from safetensors.torch import load_file, save_file

from tests.datasets import make_collapse_dataset
from tests.reference.tiny import FAMILIES, tiny_model, tiny_spec_model

#: Families of the generic walker in the world (tiny models): decoders with rotary
#: positions, parallel residuals and soft-caps, an encoder with relative positions, and
#: an image model.
SPEC_FAMILIES = ("llama", "t5", "vit", "opt", "falcon", "gemma2", "deberta-v2", "modernbert")


def _edit_weights(src: Path, dst: Path, edit) -> None:
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    save_file(edit(dict(weights)), dst / "model.safetensors", metadata={"format": "pt"})


def _edit_config(src: Path, dst: Path, edit) -> None:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))


def _poison(value: float, index: int):
    def edit(weights):
        key = sorted(weights)[index]
        tensor = weights[key].clone()
        tensor.view(-1)[0] = value
        weights[key] = tensor
        return weights

    return edit


def build_world(root: Path) -> dict[str, list[str]]:
    """Write the inputs under ``root``; {kind: [paths or names, relative to root]}."""
    root.mkdir(parents=True, exist_ok=True)
    models = root / "models"
    good = []
    for family in FAMILIES:
        folder = models / f"tiny-{family}"
        if not folder.exists():
            tiny_model(family, seed=1, dtype=torch.float32).save_pretrained(folder)
        good.append(folder)
    for family in SPEC_FAMILIES:  # the walker's families (probe/models/families.py)
        folder = models / f"tiny-{family}"
        if not folder.exists():
            tiny_spec_model(family, seed=1, dtype=torch.float32).save_pretrained(folder)
        good.append(folder)
    bert, gpt2 = models / "tiny-bert", models / "tiny-gpt2"
    hostile = {
        "nan-bert": lambda d: _edit_weights(bert, d, _poison(float("nan"), 3)),
        "inf-gpt2": lambda d: _edit_weights(gpt2, d, _poison(float("inf"), 5)),
        "partial-bert": lambda d: _edit_weights(
            bert, d, lambda w: {k: v for k, v in w.items() if ".1." not in k}
        ),
        "heads-bert": lambda d: _edit_config(bert, d, lambda c: c.update(num_attention_heads=5)),
        "heads-albert": lambda d: _edit_config(
            models / "tiny-albert", d, lambda c: c.update(num_attention_heads=5)
        ),
        "notype-bert": lambda d: _edit_config(bert, d, lambda c: c.pop("model_type")),
        "unknown-bert": lambda d: _edit_config(bert, d, lambda c: c.update(model_type="frob")),
        "zero-layers-gpt2": lambda d: _edit_config(gpt2, d, lambda c: c.update(n_layer=0)),
        "huge-gpt2": lambda d: _edit_config(
            gpt2, d, lambda c: c.update(n_embd=2**20, n_head=1, n_layer=64)
        ),
        "automap-bert": lambda d: _edit_config(
            bert, d, lambda c: c.update(auto_map={"AutoModel": "evil.Model"})
        ),
    }
    for name, make in hostile.items():
        if not (models / name).exists():
            make(models / name)
    broken = models / "broken-json"
    if not broken.exists():
        shutil.copytree(bert, broken)
        (broken / "config.json").write_text("{not json")
    truncated = models / "truncated-weights"
    if not truncated.exists():
        shutil.copytree(bert, truncated)
        data = (truncated / "model.safetensors").read_bytes()
        (truncated / "model.safetensors").write_bytes(data[: len(data) // 3])
    corrupt = models / "corrupt-tokenizer"  # refused, not random ids
    if not corrupt.exists():
        shutil.copytree(bert, corrupt)
        (corrupt / "tokenizer.json").write_text("{not json")
    (models / "empty-folder").mkdir(exist_ok=True)
    # Checkpoints whose config's dtype is not what their tensors hold: float64 files, and
    # float64 files with float32 norms, each with a config that says float32.
    for name, mixed in (("says-float32", False), ("mixed-dtypes", True)):
        if not (models / name).exists():
            _stored_otherwise(models / name, mixed)
    # A folder whose name is not UTF-8 (Linux names are bytes): a good model all the same.
    odd = models / os.fsdecode(b"tiny-gpt2-\xff")
    if not odd.exists():
        shutil.copytree(gpt2, odd)
    config_only = models / "config-only"
    if not config_only.exists():
        config_only.mkdir()
        shutil.copy(bert / "config.json", config_only / "config.json")

    texts = root / "texts"
    texts.mkdir(exist_ok=True)
    sample = Path(__file__).resolve().parents[1] / "probe" / "data" / "sample.txt"
    body = sample.read_text(encoding="utf-8")
    (texts / "good.txt").write_text(body[:6000], encoding="utf-8")
    (texts / "empty.txt").write_text("")
    (texts / "blank.txt").write_text(" \n\t\n")
    (texts / "latin1.txt").write_bytes(("café " * 200).encode("latin-1"))
    (texts / "utf16.txt").write_bytes(body[:2000].encode("utf-16"))
    (texts / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (texts / "word.txt").write_text("attention\n")
    fifo = texts / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)

    images = root / "images"
    if not images.exists():
        _images(root)

    results = root / "results"
    results.mkdir(exist_ok=True)
    _results(results)
    trained = root / "trained"
    if not trained.exists():
        shipped = Path(__file__).resolve().parents[1] / "probe" / "checkpoints"
        trained.mkdir()
        for name in ("fastformer-tiny", "gpt2-tiny"):
            shutil.copytree(shipped / name, trained / name)
        shutil.copytree(trained / "gpt2-tiny", trained / "damaged-record")
        (trained / "damaged-record" / "training.json").write_text('{"model": 3}')
        shutil.copytree(trained / "gpt2-tiny", trained / "broken-record")
        (trained / "broken-record" / "training.json").write_text("{broken")

    rel = lambda p: str(Path(p).relative_to(root))  # noqa: E731
    tokenizer = models / "tiny-bert-tokenizer"
    if not tokenizer.exists():
        _with_tokenizer(tokenizer)
    good_results = ["collapse", "collapse-other", "paths-count", "paths-sample"]
    good_results += ["paths-decompose", "toy-circle", "training", ODD_RESULT]
    cache = root / "cache"
    if not cache.exists():
        _malformed_cache(cache, [models / "tiny-gpt2", models / "tiny-llama"])
    return {
        "model": {
            "good": [rel(p) for p in good]
            + [rel(tokenizer), "fastformer-tiny", "gpt2-tiny", "minilm", "bert-base-uncased"]
            + [rel(models / n) for n in ("says-float32", "mixed-dtypes")]
            + [rel(odd)],
            "bad": [
                rel(models / n)
                for n in (*hostile, "broken-json", "truncated-weights", "corrupt-tokenizer")
            ]
            + [rel(models / n) for n in ("empty-folder", "config-only")]
            + ["no/such/model", "./nowhere", "texts/good.txt", "-", "gpt2", "x" * 300],
        },
        "file": {
            "good": ["texts/good.txt"],
            "bad": [rel(p) for p in sorted(texts.iterdir()) if p.name != "good.txt"]
            + ["texts", "texts/missing.txt", "/dev/null", "/proc/self/status", "/proc"],
        },
        "result": {
            "good": [f"results/{n}.nc" for n in good_results],
            "bad": [f"results/{n}.nc" for n in ("damaged", "foreign", "unknown-analysis")]
            + ["results/edited-attrs.nc", "results/fake.nc", "texts/good.txt", "results"]
            + ["results/missing.nc", "results/*.nc", "nothing-*.nc", "/dev/null"],
        },
        "folder": {
            "good": ["results", "trained/fastformer-tiny", "trained/gpt2-tiny"],
            "bad": ["trained/damaged-record", "trained/broken-record", "models/empty-folder"]
            + ["texts/good.txt", "nowhere", "/proc", "/dev/null", "texts/fifo"],
        },
        "images": {
            "good": ["images/rgb", "images/one", "images/sixteen"],
            "bad": [
                "images/broken",
                "images/none",
                "images/transparent",
                "images/float-range",
                "models/empty-folder",
                "texts/good.txt",
            ]
            + ["nowhere", "/proc", "/dev/null", "texts/fifo"],
        },
        "family": {
            "good": ["bert", "gpt2", "llama", "t5", "vit", "albert", "xlnet", "fastformer"],
            "bad": ["nope", "BERT", "bert ", "", "gpt-2", "../bert"],
        },
        "out-folder": {
            "good": ["out", "out/deeper/still", "results", "models/empty-folder", "."]
            + [os.fsdecode(b"out-\xff\xfe")],
            "bad": ["texts/good.txt", "texts/good.txt/below", "/proc", "/proc/out", "/dev/null"]
            + ["texts/fifo"],
        },
        "new-folder": {
            "good": ["ff", "ff-other", "trained/gpt2-tiny", "models/empty-folder"],
            "bad": [".", "sub/..", "models/tiny-bert", "texts/good.txt", "/proc/ff", "/", ".."]
            + ["texts/fifo", "results"],
        },
        # Overflow-prone values are good ones: a run they overflow stops with one line.
        "setting": {
            "good": ["n_layer=1", "num_hidden_layers=1", "initializer_range=0.5"]
            + ["initializer_range=1e30"],
            "bad": ["", "=", "n_layer", "nope=1", "n_layer=abc", "n_layer=2.5", "n_layer=-1"]
            + ["n_layer=" + "9" * 5000, "n_layer=١", "n_layer=:-1:"],
        },
        "revision": {
            "good": ["main", "step1000"],
            "bad": ["", " ", "a b", "x" * 300],
        },
        "branch-scale": {
            "good": ["1", "0.5", "1/sqrt(L)", "L^-0.5", "1/L", "1e30"],
            "bad": ["", "0", "-1", "x", "1/", "__import__('os')", "1/(L-L)", "1e999"],
        },
        # A sweep's lists (--set KEY=V1,V2, --branch-scale, --revisions): grids, one value,
        # overflow-prone values; empty items, repeats, reserved names, what no reader takes.
        "grid-setting": {
            "good": ["n_layer=1,2", "num_hidden_layers=1,2", "initializer_range=0.02,1e30"]
            + ["initializer_range=0.5,1", "n_layer=1", "initializer_range=1e30"],
            "bad": ["", "=", "n_layer", "n_layer=", "n_layer=1,,2", "n_layer=1,", "n_layer=1,1"]
            + ["layer=1,2", "seed=1,2", "variant=1,2", "nope=1,2", "n_layer=abc,1", "1=2"]
            + ["n_layer=1e999", "n_layer=2.5,1", "n_layer=-1,1", "__import__('os')=1"]
            + ["n_layer=__import__('os')", "n_layer=1\0", "n_layer=1," + "9" * 5000]
            + ["n_layer=١,2", "n_layer=[bold]1[/bold],2"],
        },
        "branch-scales": {
            "good": ["1,0.5", "0.5,1", "1,1/sqrt(L)", "1,1e30", "1/L,L^-0.5", "1", "1e30"],
            "bad": ["", ",", "1,,2", "1,", ",1", "x", "1,x", "__import__('os')", "1e999"]
            + ["1,1e999", "1,1", "0,1", "-1,1", "1,1/(L-L)", "nan,1", "inf"],
        },
        "mask": {
            "good": ["model", "bidirectional", "causal", "window:1", "causal-window:4"]
            + ["window:100000", "CAUSAL"],
            "bad": ["", "casual", "window", "window:0", "window:-1", "causal:2", "window:x"]
            + ["window:1.5", "window:1e999", "model:1", "window:١٢", "window:１２"]
            + ["window:" + "9" * 5000, "window:99999999999999999999", "causal-window:2147483648"]
            + ["[b]:smile:", ":-1:"],
        },
        "masks": {
            "good": ["bidirectional,causal", "causal,window:2", "model,bidirectional"]
            + ["window:1,window:2", "causal"],
            "bad": ["", ",", "causal,,window:1", "causal,", "causal,causal", "casual,causal"]
            + ["window:0,causal", "window:1,window:01", "causal,window:" + "9" * 40]
            + ["causal,window:٢"],
        },
        "revisions": {
            "good": ["main", "main,step1000", "step0,step1000"],
            "bad": ["", ",", "main,,step1", "main,", "main,main", "a b,main", "x" * 300]
            + ["main,x\0"],
        },
        "text": {
            "good": ["latest", "results/collapse.html", "results/collapse.nc"],
            "bad": ["missing.html", "texts/good.txt/x.html", "/proc"],
        },
    }


def _images(root: Path) -> None:
    """Folders for ``--images``: RGB images (PNG and JPEG), one image, 16-bit gray, a damaged
    image, transparent and out-of-range ones, none."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, count in (("rgb", 3), ("one", 1)):
        folder = root / "images" / name
        folder.mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.{'png' if i % 2 == 0 else 'jpg'}")
    broken = root / "images" / "broken"
    broken.mkdir()
    (broken / "0.png").write_bytes(b"\x89PNG not an image")
    # Image modes read by their range (16-bit gray), or refused (alpha, floats past 1).
    for name, image, suffix in (
        ("sixteen", Image.fromarray(np.full((16, 16), 40000, np.uint16)), "png"),
        ("transparent", Image.new("RGBA", (16, 16), (9, 9, 9, 0)), "png"),
        ("float-range", Image.fromarray(np.full((16, 16), 3.0, np.float32)), "tif"),
    ):
        (root / "images" / name).mkdir()
        image.save(root / "images" / name / f"0.{suffix}")
    none = root / "images" / "none"
    none.mkdir()
    (none / "notes.txt").write_text("no images here")


def _with_tokenizer(folder: Path) -> None:
    """A tiny BERT over the bert-base-uncased vocabulary of the embedded MiniLM, with it."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from probe.loading import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(3)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _results(folder: Path) -> None:
    """One result file of every analysis probe writes, and files that only look like one."""
    from probe.analyses import paths as path_analyses
    from probe.analyses import toy
    from probe.fastformer.train import curves, read_training
    from probe.files.results import save_result
    from tests.paths_tiny import tiny_paths_model

    if (folder / "collapse.nc").exists():
        return
    save_result(make_collapse_dataset(), folder / "collapse.nc")
    save_result(make_collapse_dataset(model="other", seed=1), folder / "collapse-other.nc")
    save_result(make_collapse_dataset().drop_vars("stable_rank"), folder / "damaged.nc")
    save_result(path_analyses.count(layers=3, heads=2), folder / "paths-count.nc")
    model = tiny_paths_model("bert")
    save_result(
        path_analyses.sample(model, samples=3, sequences=2, tokens=6, init="pretrained"),
        folder / "paths-sample.nc",
    )
    save_result(
        path_analyses.decompose(model, sequences=1, tokens=6, init="pretrained"),
        folder / "paths-decompose.nc",
    )
    save_result(
        toy.run("circle", quick=True, epochs=1, points=8, steps=2), folder / "toy-circle.nc"
    )
    shipped = Path(__file__).resolve().parents[1] / "probe" / "checkpoints"
    save_result(
        curves([read_training(shipped / "fastformer-tiny"), read_training(shipped / "gpt2-tiny")]),
        folder / "training.nc",
    )
    foreign = xr.Dataset({"x": (("a",), np.arange(3.0))})
    foreign.to_netcdf(folder / "foreign.nc", engine="h5netcdf")
    unknown = make_collapse_dataset()
    unknown.attrs["analysis"] = "frobnicate"
    save_result(unknown, folder / "unknown-analysis.nc")
    edited = make_collapse_dataset()
    edited.attrs["dtype"] = "float7"
    edited.attrs["model"] = ""
    save_result(edited, folder / "edited-attrs.nc")
    (folder / "fake.nc").write_text("not netcdf")
    shutil.copy(folder / "collapse.nc", folder / f"{ODD_RESULT}.nc")


#: A result whose file name is not UTF-8, beside its report.
ODD_RESULT = os.fsdecode(b"collapse-\xff")


def _stored_otherwise(folder: Path, mixed: bool) -> None:
    """A tiny llama stored in float64 (``mixed``: its norms in float32) whose config says
    float32."""
    model = tiny_spec_model("llama", seed=1, dtype=torch.float64)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1e-9)  # values float32 cannot hold
    if mixed:
        for name, module in model.named_modules():
            if name.endswith("norm"):
                module.float()
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config))


#: The cache folder whose theory constants are malformed, and the entries put there.
MALFORMED = ["{}", "[]", '{"missing": "x"}', '{"beta": [1.0]}', "null", '{"missing": []}']


def _malformed_cache(cache: Path, folders: list[Path]) -> None:
    """A probe cache (``PROBE_CACHE_DIR``) whose theory constants, for these models at
    random and pretrained init (seed 0, float32, the CPU), are malformed entries (the
    fuzzer's lines run with it now and then); the self-test's passes are kept as they are."""
    import probe
    from probe.measures import theory_cache

    saved = os.environ.get("PROBE_CACHE_DIR")
    os.environ["PROBE_CACHE_DIR"] = str(cache)
    try:
        for index, folder in enumerate(folders):
            for init in ("random", "pretrained"):
                probed = probe.load(folder, init=init)
                name = theory_cache.key(probed)
                if name is not None:
                    entry = cache / "theory" / f"{name}.json"
                    entry.parent.mkdir(parents=True, exist_ok=True)
                    entry.write_text(MALFORMED[index % len(MALFORMED)])
                index += 1
    finally:
        if saved is None:
            os.environ.pop("PROBE_CACHE_DIR", None)
        else:
            os.environ["PROBE_CACHE_DIR"] = saved


def copy_world(world: Path, sandbox: Path) -> None:
    """A private copy of ``world`` in ``sandbox`` (hard links where the filesystem allows)."""
    for entry in world.iterdir():
        target = sandbox / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, copy_function=_link, symlinks=True)
        else:
            _link(entry, target)


def _link(src, dst) -> None:
    src, dst = Path(src), Path(dst)
    if src.is_fifo():
        os.mkfifo(dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
