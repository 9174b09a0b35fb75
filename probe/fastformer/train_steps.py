"""Checkpoints along training: which steps are saved, and how (``TrainSettings.save_every``).

With ``save_every`` N the run also keeps a checkpoint every N optimizer steps, at step 0
(the init) and at the last step; with ``"log"`` (:data:`LOG`) at steps spaced
logarithmically: 0, then 1, 3, 10, 30, 100, ... (each about sqrt(10) times the one before),
and the last step, where a logarithmic step within a factor of 2 below the last is left out
so the last interval is not a sliver on a log axis (400 steps: 0, 1, 3, 10, 30, 100, 400).

The checkpoints of a model trained into ``folder`` form a *series*, ``folder-steps`` beside
it (``gpt2-tiny`` -> ``gpt2-tiny-steps``): one ``save_pretrained`` folder per step,
``step-000010``, with the tokenizer and ``step.json`` (the step, the training loss of the
step that led there, these weights' validation bits per character, the command, the data
and the settings), and ``series.json`` at the root, listing the steps with their losses
(:mod:`probe.loading.shipped` reads it back).  The weights are stored in ``save_dtype``
(float16 halves a float32 series); the training itself always runs on its own weights.

Saving never changes the training: each checkpoint is a copy of the model cast on the CPU,
and its validation loss is measured without gradients in eval mode, which draws no random
numbers (dropout is off there), so the weights at the end are bit for bit those of a run
without ``save_every``.  The series is staged beside its target while the model trains and
put in place with the model's own folder, or not at all (:class:`probe.files.results.Unit`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from ..loading.shipped import SERIES_FILE, STEP_FILE, step_folder_name

#: ``save_every`` for logarithmically spaced steps.
LOG = "log"
#: The dtypes a series may be stored in.
SAVE_DTYPES = ("float32", "float16", "bfloat16")


def save_steps(save_every: int | str, total: int) -> list[int]:
    """The steps saved for ``save_every`` (N or :data:`LOG`) in a run of ``total`` steps."""
    if save_every == LOG:
        steps, k = [], 0
        while (step := _log_step(k)) < total:
            if 2 * step <= total:  # not within a factor of 2 below the last
                steps.append(step)
            k += 1
        return [0, *steps, total]
    return sorted({*range(0, total, int(save_every)), total})


def _log_step(k: int) -> int:
    """1, 3, 10, 30, 100, 300, ...: 10^(k/2), its leading digit rounded down to 1 or 3."""
    return (3 if k % 2 else 1) * 10 ** (k // 2)


def series_folder(folder: str | Path) -> Path:
    """The series of the model trained into ``folder``: ``folder-steps`` beside it."""
    folder = Path(folder)
    return folder.with_name(f"{folder.name}-steps")


def series_bytes(parameters: int, settings) -> int:
    """About what a series takes on disk: its weights, plus a little per folder."""
    count = len(save_steps(settings.save_every, settings.steps))
    size = torch.finfo(getattr(torch, settings.save_dtype)).bits // 8
    return count * (parameters * size + 2**16)


class StepSaver:
    """Saves one model's series into ``staging`` (the staged ``series_folder``), as
    ``fit``'s ``on_step`` callback: ``saver(step, model, train_loss, bits)``."""

    def __init__(
        self,
        name: str,
        staging: Path,
        series_name: str,
        tokenizer,
        settings,
        evaluate: Callable[[torch.nn.Module], float],
        data: dict,
    ) -> None:
        self.name, self.staging, self.series_name = name, Path(staging), series_name
        self.tokenizer, self.settings, self.evaluate, self.data = (
            tokenizer,
            settings,
            evaluate,
            data,
        )
        self.steps = save_steps(settings.save_every, settings.steps)
        self.dtype = getattr(torch, settings.save_dtype)
        self.saved: list[dict] = []

    def __call__(self, step: int, model, train_loss: float | None, bits: float | None) -> None:
        if step not in self.steps:
            return
        if bits is None:
            bits = self.evaluate(model)
        folder = self.staging / step_folder_name(step)
        copied = copy.deepcopy(model).to(device="cpu", dtype=self.dtype)
        copied.save_pretrained(folder)  # under fit's quiet_transformers: no shard bar
        self.tokenizer.save_pretrained(folder)
        record = {
            "model": self.name,
            "series": self.series_name,
            "step": step,
            "steps": self.settings.steps,
            "dtype": self.settings.save_dtype,
            "train_loss": train_loss,  # nats, the batch of the step that led here (before it)
            "val_bits_per_char": bits,  # these weights, on the held-out windows
            "command": self.settings.command,
            "data": self.data,
            "settings": settings_record(self.settings),
        }
        (folder / STEP_FILE).write_text(json.dumps(record, indent=1) + "\n")
        self.saved.append(record)

    def finish(self, parameters: int) -> None:
        """Write ``series.json``: the steps, the command and settings, the losses."""
        if [r["step"] for r in self.saved] != self.steps:
            raise AssertionError(f"saved {[r['step'] for r in self.saved]}, meant {self.steps}")
        record = {
            "series": self.series_name,
            "model": self.name,
            "command": self.settings.command,
            "save_every": self.settings.save_every,
            "dtype": self.settings.save_dtype,
            "steps": self.steps,
            "folders": [step_folder_name(s) for s in self.steps],
            "train_loss": [r["train_loss"] for r in self.saved],
            "val_bits_per_char": [r["val_bits_per_char"] for r in self.saved],
            "parameters": parameters,
            "data": self.data,
            "settings": settings_record(self.settings),
        }
        (self.staging / SERIES_FILE).write_text(json.dumps(record, indent=1) + "\n")


def settings_record(settings) -> dict:
    """The settings as ``training.json`` records them (no text, folders or command line)."""
    return {
        k: v
        for k, v in asdict(settings).items()
        if k not in ("text", "out", "baseline_out", "command")
    }
