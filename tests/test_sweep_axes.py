"""A sweep's axis must change what runs, and a checkpoint series must be one training run.

Each refused case is asked twice, of the library (``sweep.plan``) and of the command
(``probe sweep ... --dry-run``): the same one line (the command's naming flags where the
library's names parameters), exit 2 and nothing written.  Sweeps whose axes do change the
run are planned.  Only plans run here: configs and tokenizers are read, no point runs.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from probe import Inputs, Model
from probe.analyses import sweep
from probe.analyses.sweep_axes import one_training_run
from probe.analyses.sweep_points import Axis
from probe.errors import ProbeError

SIZES = {"sequences": 2, "tokens": 8}
CLI_SIZES = ["--sequences", "2", "--tokens", "8"]


@pytest.fixture(scope="module")
def names(tiny_folders, tiny_family_folder, tmp_path_factory) -> dict[str, str]:
    """The models of the cases: tiny folders (no tokenizer), a copy of one, a deeper one, a
    ViT and a folder of images, and probe's gpt2-tiny (with its tokenizer)."""
    from PIL import Image
    from transformers import AutoConfig, GPT2Model

    root = tmp_path_factory.mktemp("axes")
    gpt2 = tiny_folders["gpt2"]
    shutil.copytree(gpt2, root / "copy")
    config = AutoConfig.from_pretrained(gpt2)
    config.n_layer = 3
    torch.manual_seed(0)
    GPT2Model(config).save_pretrained(root / "deeper")
    (root / "images").mkdir()
    for index in range(2):
        pixels = np.full((16, 16, 3), 40 * index + 20, dtype=np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"{index}.png")
    return {
        "gpt2": gpt2,
        "copy": str(root / "copy"),
        "deeper": str(root / "deeper"),
        "bert": tiny_folders["bert"],
        "vit": tiny_family_folder("vit"),
        "images": str(root / "images"),
        "gpt2-tiny": "gpt2-tiny",
        "gpt2-tiny-steps": "gpt2-tiny-steps",
    }


def _given(request, names, key: str) -> str:
    return request.getfixturevalue("hub_cache") if key == "hub" else names[key]


#: (id, model, command-line options, the library's keywords, words of the line).  A model
#: given as a list is several step folders; the library gets them as (step, folder) pairs.
REFUSED = [
    ("seeds at pretrained weights through a tokenizer", "gpt2-tiny",
     ["--init", "pretrained", "--seeds", "0-1"], {"init": "pretrained", "seeds": "0-1"},
     "`seeds` cannot change the run: at `init` pretrained the weights are the checkpoint's "
     "and the inputs are a text read through the model's tokenizer"),
    ("seeds at pretrained weights on images", "vit",
     ["--init", "pretrained", "--seeds", "0,3", "--images", "{images}"],
     {"init": "pretrained", "seeds": "0,3", "images": "{images}"},
     "the inputs are the images of `images`, so nothing is drawn from a seed"),
    ("tokens of an image model", "vit", ["--init", "random", "--tokens", "8,16"],
     {"init": "random", "tokens": "8,16"},
     "`tokens` cannot change the run: {vit} reads images, each as its 16 patches"),
    ("branch scales of one value", "gpt2", ["--init", "random", "--branch-scale", "1,1.0"],
     {"init": "random", "branch_scale": "1,1.0"},
     "`branch_scale` 1 and 1.0 are the same scale at every depth the sweep runs (L=2)"),
    ("branch scales of one expression", "gpt2",
     ["--init", "random", "--branch-scale", "0.25,1/L,L^-1"],
     {"init": "random", "branch_scale": ["0.25", "1/L", "L^-1"]},
     "`branch_scale` 1/L and L^-1 are the same scale at every depth"),
    ("config values read alike", "gpt2", ["--init", "random", "--set", "initializer_range=1,1.0"],
     {"init": "random", "config": {"initializer_range": [1, 1.0]}},
     "the config field initializer_range reads 1 and 1.0 as one value, 1.0"),
    ("a dropout field", "bert", ["--init", "random", "--set", "hidden_dropout_prob=0,0.1"],
     {"init": "random", "config": {"hidden_dropout_prob": "0,0.1"}},
     "the config field hidden_dropout_prob cannot change the run: it is dropout, which is off"),
    ("use_cache", "gpt2", ["--init", "random", "--set", "use_cache=true,false"],
     {"init": "random", "config": {"use_cache": "true,false"}},
     "the config field use_cache cannot change the run"),
    ("revisions of a local folder", "gpt2", ["--init", "pretrained", "--revisions", "a,b"],
     {"init": "pretrained", "revisions": "a,b"}, "is a local folder, not a hub id"),
    ("revisions of one commit", "hub", ["--init", "pretrained", "--revisions", "step1,step2,main"],
     {"init": "pretrained", "revisions": "step1,step2,main"},
     "`revisions` step1 and main are one commit of probe-test/tiny-gpt2 (000000000000)"),
    ("revisions of one config at random init", "hub",
     ["--init", "random", "--revisions", "step1,step2"],
     {"init": "random", "revisions": "step1,step2"},
     "`revisions` step1 and step2 hold the same config of probe-test/tiny-gpt2, and at "
     "`init` random a revision gives only its config"),
    ("steps of the same weights", ["gpt2", "copy"], ["--init", "pretrained"],
     {"init": "pretrained"}, "`steps` 0 and 5 hold the same weights ({gpt2} and {copy})"),
    ("steps of other configs", ["gpt2", "deeper"], ["--init", "pretrained"],
     {"init": "pretrained"},
     "`steps` are not one training run: step 5 ({deeper}) has n_layer=3 where step 0 ({gpt2}) "
     "has n_layer=2"),
    ("steps of other families", ["gpt2", "bert"], ["--init", "pretrained"],
     {"init": "pretrained"},
     "`steps` are not one training run: step 5 ({bert}) is a bert checkpoint and step 0 "
     "({gpt2}) a gpt2 one"),
    ("the shipped series at random init", "gpt2-tiny-steps", ["--init", "random"],
     {"init": "random"}, "`steps` cannot change the run at `init` random"),
]  # fmt: skip
IDS = [case[0] for case in REFUSED]


def _library(case, names, request):
    _, model, _, kwargs, words = case
    kwargs = {k: v.format(**names) if isinstance(v, str) else v for k, v in kwargs.items()}
    if isinstance(model, list):
        folders = [names[key] for key in model]
        kwargs["steps"] = list(zip((0, 5), folders, strict=True))
        model = folders[0]
    else:
        model = _given(request, names, model)
    return model, kwargs, words.format(**names)


@pytest.mark.parametrize("case", REFUSED, ids=IDS)
def test_an_axis_that_cannot_change_the_run_is_refused_in_one_line(case, names, request):
    model, kwargs, words = _library(case, names, request)
    with pytest.raises(ProbeError) as err:
        sweep.plan(model, **{**SIZES, **kwargs})
    line = str(err.value)
    assert "\n" not in line and words in line, line


@pytest.mark.parametrize("case", REFUSED, ids=IDS)
def test_the_command_refuses_it_in_the_same_line(case, names, request, tmp_path, monkeypatch):
    from probe.cli.app import app

    model, _, words = _library(case, names, request)
    _, given, args, _, _ = case
    models = [names[key] for key in given] if isinstance(given, list) else [model]
    steps = ["--steps", "0,5"] if isinstance(given, list) else []
    args = [a.format(**names) for a in args]
    work = tmp_path / "work"  # beside the hub cache of the revisions' cases
    work.mkdir()
    monkeypatch.chdir(work)
    sizes = CLI_SIZES[:2] if "--tokens" in args else CLI_SIZES
    done = CliRunner().invoke(
        app, ["sweep", *models, *steps, *args, *sizes, "--dry-run", "--out", "r"]
    )
    assert done.exit_code == 2, done.output
    (line,) = done.stderr.splitlines()
    assert line.startswith("probe: error: ") and "`" not in line, line  # parameters as flags
    pieces = [piece for piece in re.split(r"`[a-z_]+`", words) if piece.strip()]
    assert all(piece in line for piece in pieces), line
    assert list(work.iterdir()) == []


@pytest.mark.parametrize(
    ("model", "kwargs", "size"),
    [
        ("gpt2-tiny", {"init": "random", "seeds": "0-1"}, 2),  # the seed draws the weights
        ("gpt2-tiny", {"init": "both", "seeds": "0-1"}, 2),
        ("gpt2", {"init": "pretrained", "seeds": "0-1"}, 2),  # no tokenizer: synthetic ids
        ("gpt2", {"init": "pretrained", "seeds": "0-1", "allow_missing_weights": True}, 2),
        ("vit", {"init": "pretrained", "seeds": "0-1"}, 2),  # noise images
        ("gpt2", {"init": "random", "branch_scale": "1,1/sqrt(L)"}, 2),
        ("gpt2", {"init": "random", "config": {"initializer_range": "0.02,1"}}, 2),
        ("gpt2", {"init": "random", "config": {"n_layer": "1,2"}, "branch_scale": "1,L^-0.5"}, 4),
        ("gpt2-tiny-steps", {"init": "pretrained"}, 7),
        ("gpt2-tiny-steps", {"init": "both", "seeds": "0-1"}, 14),
        ("hub", {"init": "pretrained", "revisions": "step1,step2"}, 2),
    ],
)
def test_an_axis_that_changes_the_run_is_planned(model, kwargs, size, names, request):
    planned = sweep.plan(_given(request, names, model), **{**SIZES, **kwargs})
    assert len(planned.points) == size


def test_the_shipped_series_is_one_training_run(tmp_path, monkeypatch):
    from probe.analyses.sweep_points import series
    from probe.cli.app import app

    steps = series("gpt2-tiny-steps")
    one_training_run(Axis("step", "step", *zip(*steps, strict=True)))
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(
        app, ["sweep", "gpt2-tiny-steps", "--init", "pretrained", *CLI_SIZES, "--dry-run"]
    )
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("point 1/7: step=0 · to run")


def _folder(path: Path, template: str, weights: bytes) -> str:
    path.mkdir()
    shutil.copy(Path(template) / "config.json", path / "config.json")
    (path / "pytorch_model.bin").write_bytes(weights)
    return str(path)


def test_weights_are_the_same_only_byte_for_byte(names, tmp_path):
    """Files that agree in every sampled block but differ between them are two checkpoints;
    a copy of the same bytes under another folder is one."""
    weights = bytearray(np.random.default_rng(0).bytes(4 * 2**20))
    first = _folder(tmp_path / "a", names["gpt2"], bytes(weights))
    weights[2**20 + 70_000] ^= 1  # between the sampled blocks of a 4 MiB file
    other = _folder(tmp_path / "b", names["gpt2"], bytes(weights))
    same = _folder(
        tmp_path / "c", names["gpt2"], (tmp_path / "a" / "pytorch_model.bin").read_bytes()
    )
    one_training_run(Axis("step", "step", (0, 1), (first, other)))
    with pytest.raises(ProbeError, match=r"`steps` 0 and 2 hold the same weights"):
        one_training_run(Axis("step", "step", (0, 1, 2), (first, other, same)))


def test_what_a_save_writes_about_itself_may_differ_along_a_run(names, tmp_path):
    import json

    first = Path(names["gpt2"])
    later = tmp_path / "later"
    shutil.copytree(first, later)
    config = json.loads((later / "config.json").read_text())
    config.update(transformers_version="0.0.1", dtype="float16", _name_or_path="elsewhere")
    (later / "config.json").write_text(json.dumps(config))
    (later / "model.safetensors").write_bytes(b"other" + (first / "model.safetensors").read_bytes())
    one_training_run(Axis("step", "step", (0, 1), (str(first), str(later))))


def test_a_sweep_given_in_the_library_form_is_checked_the_same(names):
    with pytest.raises(ProbeError, match="`branch_scale` 1 and 1.0 are the same scale"):
        sweep.plan(Model(names["gpt2"], init="random"), Inputs(**SIZES), branch_scale=[1, 1.0])
