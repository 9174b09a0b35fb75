"""The names and folders of the trained checkpoints that ship with probe (``probe/checkpoints``).

Kept apart from :mod:`probe.fastformer` (whose package registers the Fastformer with
transformers' Auto classes and imports its modelling code): resolving any model name asks
whether it is one of these, and that question needs neither.  The Fastformer is registered
when a config that names it is read (:func:`probe.loading.resolve.config_at`).

A *series* is one training run's checkpoints along its training, written by
``probe.fastformer.train`` with ``save_every``: a folder holding :data:`SERIES_FILE` (the
steps, the command that made them, the losses) and one ``save_pretrained`` folder per step,
``step-000000`` (the init) to the last step, each with its tokenizer and :data:`STEP_FILE`.
``gpt2-tiny-steps`` ships (:data:`SERIES`); :func:`series` resolves it, or any folder such a
run wrote, to its steps and folders.  A series is many checkpoints: an analysis of one
checkpoint takes one of its step folders.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..errors import ProbeError, one_line

#: ``fastformer-tiny`` and its GPT-2 baseline ``gpt2-tiny`` (see :mod:`probe.fastformer.shipped`).
SHIPPED = ("fastformer-tiny", "gpt2-tiny")

#: Checkpoint series that ship: ``gpt2-tiny`` trained again with checkpoints along training.
SERIES = ("gpt2-tiny-steps",)

#: The record at the root of a series, and the one in each of its step folders.
SERIES_FILE = "series.json"
STEP_FILE = "step.json"

#: The ``model_type`` of a Fastformer config (``probe.fastformer.config``; not imported here).
FASTFORMER_MODEL_TYPE = "FastformerForCausalLM"


def _checkpoints() -> Path:
    return Path(str(resources.files("probe") / "checkpoints"))


def shipped_path(name: str) -> Path | None:
    """The folder of a shipped checkpoint, or None for any other name."""
    if name not in SHIPPED:
        return None
    folder = _checkpoints() / name
    return folder if (folder / "config.json").is_file() else None


def step_folder_name(step: int) -> str:
    """The folder of one step in a series: ``step-000010`` (six digits, more past a million)."""
    return f"step-{step:06d}"


def series_path(name: str) -> Path | None:
    """The root folder of a series: a shipped one by name (a local folder of that name wins,
    as for every name), or a folder holding :data:`SERIES_FILE`; None for anything else."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path if (path / SERIES_FILE).is_file() else None
    if name in SERIES:
        folder = _checkpoints() / name
        return folder if (folder / SERIES_FILE).is_file() else None
    return None


def series(name: str) -> list[tuple[int, Path]] | None:
    """``[(step, folder), ...]`` of a series, steps ascending; None if ``name`` is no series.

    ``name`` is a shipped series (:data:`SERIES`) or a folder a training run with
    ``save_every`` wrote.  The steps are those its :data:`SERIES_FILE` lists; each must be
    a folder holding ``config.json`` and a :data:`STEP_FILE` that names the same step, else
    the series is refused in one line (never half used).
    """
    root = series_path(name)
    if root is None:
        return None
    record = read_series(root)
    found = []
    for step in record["steps"]:
        folder = root / step_folder_name(step)
        problem = _step_problem(folder, step)
        if problem:
            raise ProbeError(f"the checkpoint series {name} is damaged: {problem}; train it again")
        found.append((step, folder))
    return found


def read_series(root: Path) -> dict:
    """The :data:`SERIES_FILE` of a series folder, its steps checked (whole numbers from 0,
    ascending, none twice)."""
    path = Path(root) / SERIES_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ProbeError(f"cannot read {path}: {one_line(err)}") from None
    steps = record.get("steps") if isinstance(record, dict) else None
    if (
        not isinstance(steps, list)
        or not steps
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        or any(a >= b for a, b in zip(steps, steps[1:], strict=False))
    ):
        raise ProbeError(f"{path} is damaged ('steps' is not an ascending list of whole numbers)")
    return record


def _step_problem(folder: Path, step: int) -> str:
    if not (folder / "config.json").is_file():
        return f"{folder} has no config.json"
    try:
        record = json.loads((folder / STEP_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"cannot read {folder / STEP_FILE} ({one_line(err)})"
    if not isinstance(record, dict) or record.get("step") != step:
        return f"{folder / STEP_FILE} does not name step {step}"
    return ""


def series_refusal(name: str, root: Path) -> str:
    """The line for a series given where one checkpoint is wanted."""
    try:
        steps = read_series(root)["steps"]
    except ProbeError:
        steps = []
    listed = (
        f"{len(steps)} checkpoints, steps {steps[0]} to {steps[-1]}" if steps else "checkpoints"
    )
    last = root / step_folder_name(steps[-1]) if steps else root / "step-NNNNNN"
    return (
        f"{name} is a series of {listed} along one training run, not one checkpoint; "
        f"sweep it (`probe sweep {name}`), or give one step's folder, e.g. {last}"
    )
