"""Training a character-level Fastformer, and the matching GPT-2 beside it.

``train(TrainSettings(...))`` reads the text, builds the character tokenizer
(:mod:`.tokenizer`), holds out the last ``val_fraction`` of the characters,
and trains with AdamW under a linear warm-up and a cosine decay (to a tenth of
the peak rate).  Each step takes ``batch`` windows of ``context``
characters at seeded random offsets of the training split; the loss is the
next-character cross entropy of the last context - 1 characters, in nats, and bits per character = loss / ln 2.
The validation loss is the mean over consecutive, non-overlapping windows of
the held-out split.

``baseline="gpt2"`` trains a GPT2LMHeadModel of the same width, depth, heads
and context on the same tokenizer, batches (the same offsets, from the same
seed), steps, schedule and split, so the two curves compare additive against
full attention (the seed write-up's experiment).  Both folders get the
weights (safetensors), the tokenizer and ``training.json``: the command line,
the data's sha256, the settings, the final validation bits per character and
the curves.  The curves also come back as an xarray Dataset (:func:`curves`).

Nothing is written until every model has trained: a run that diverges (a loss or a
weight that is not finite) or is interrupted leaves no folder behind.  The folders are
then staged beside their targets and renamed into place together
(:class:`probe.files.results.Unit`): concurrent runs into one folder put their results in
place one after the other, never mixed, and a folder of a killed run is removed by the
next one.  ``TrainSettings.check`` refuses what cannot fit in memory before any of it.

With ``save_every`` each model also keeps checkpoints along its training, a series of
``save_pretrained`` folders beside its own (``gpt2-tiny`` -> ``gpt2-tiny-steps``), saved
without changing the training by a bit (:mod:`.train_steps`).

The settings, their checks and the two models' builds live in :mod:`.train_settings`;
the record (``training.json`` read back, and the curves as a Dataset) in
:mod:`.train_record`; this module is the training itself and the writing of the
folders, and re-exports the public names of both.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from probe.files.results import Unit, check_space

from ..errors import ProbeError
from .tokenizer import char_tokenizer, encode
from .train_record import TRAINING_FILE, curves, read_training
from .train_settings import (
    MAX_LR,
    TrainSettings,
    baseline_folder,
    fastformer_for,
    gpt2_for,
    quiet_transformers,
)
from .train_steps import (
    LOG,
    SAVE_DTYPES,
    StepSaver,
    save_steps,
    series_bytes,
    series_folder,
    settings_record,
)

__all__ = [
    "LOG", "MAX_LR", "SAVE_DTYPES", "TRAINING_FILE", "Curve", "OnStep", "Progress",
    "StepSaver", "TrainSettings", "baseline_folder", "batch_offsets", "check_finite_weights",
    "curves", "evaluate", "fastformer_for", "fit", "gpt2_for", "lr_factor", "read_training",
    "save_steps", "series_folder", "split", "train", "windows",
]  # fmt: skip

#: (model name, step, total steps, train loss, validation bits/char or None)
Progress = Callable[[str, int, int, float, float | None], None]
#: (step, model, train loss or None at step 0, validation bits/char or None)
OnStep = Callable[[int, torch.nn.Module, float | None, float | None], None]


@dataclass
class Curve:
    """One model's training record."""

    name: str
    steps: list[int]
    seconds: list[float]
    train_loss: list[float]
    eval_steps: list[int]
    eval_seconds: list[float]
    val_bits_per_char: list[float]
    folder: str = ""

    @property
    def final_bits_per_char(self) -> float:
        return self.val_bits_per_char[-1]


def lr_factor(step: int, warmup: int, total: int, floor: float = 0.1) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine decay to ``floor`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def split(ids: torch.Tensor, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    cut = int(len(ids) * (1 - val_fraction))
    return ids[:cut], ids[cut:]


def batch_offsets(n_ids: int, settings: TrainSettings) -> torch.Tensor:
    """(steps, batch) start offsets, drawn once from the seed: both models see the same windows."""
    gen = torch.Generator().manual_seed(settings.seed)
    high = n_ids - settings.context
    if high < 1:
        raise ProbeError(f"the training split is shorter than `context` {settings.context}")
    return torch.randint(0, high + 1, (settings.steps, settings.batch), generator=gen)


def windows(ids: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """(len(starts), length) windows of ``ids``."""
    return ids[starts[:, None] + torch.arange(length)]


@torch.no_grad()
def evaluate(model, val: torch.Tensor, settings: TrainSettings) -> float:
    """Mean next-character loss over non-overlapping validation windows, in bits per character."""
    length = settings.context  # each window predicts context - 1 next characters
    count = min(settings.eval_windows, len(val) // length)
    starts = torch.arange(count) * length
    model.eval()
    total, chars = 0.0, 0
    for chunk in windows(val, starts, length).split(settings.batch):
        chunk = chunk.to(settings.device)
        loss = model(input_ids=chunk, labels=chunk, use_cache=False).loss
        n = chunk.shape[0] * (length - 1)
        total, chars = total + loss.item() * n, chars + n
    model.train()
    return total / chars / math.log(2)


def fit(
    name: str,
    model,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    offsets: torch.Tensor,
    settings: TrainSettings,
    progress: Progress | None = None,
    on_step: OnStep | None = None,
) -> Curve:
    """Train ``model`` in place on the windows at ``offsets``; returns its curve.

    ``on_step(step, model, train_loss, bits)`` sees the model at step 0 (the init, no loss)
    and after every optimizer step (the loss of that step's batch, and the validation bits
    per character where the step evaluated, else None); it must leave the model as it is
    (:class:`.train_steps.StepSaver` saves checkpoints along training this way).
    """
    device = torch.device(settings.device)
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": settings.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, settings.warmup_steps, settings.steps)
    )
    curve = Curve(name, [], [], [], [], [], [])
    start = time.perf_counter()
    length = settings.context  # each window predicts context - 1 next characters
    if on_step is not None:
        on_step(0, model, None, None)
    for step in range(settings.steps):
        batch = windows(train_ids, offsets[step], length).to(device)
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        if not torch.isfinite(loss):
            raise ProbeError(
                f"{name}: training diverged (the loss became {loss.item()} at step {step + 1}); "
                "nothing was saved; lower `lr`"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        curve.steps.append(step + 1)
        curve.seconds.append(time.perf_counter() - start)
        curve.train_loss.append(loss.item())
        bits = None
        if (step + 1) % settings.eval_interval == 0 or step + 1 == settings.steps:
            bits = evaluate(model, val_ids, settings)
            if not math.isfinite(bits):
                raise ProbeError(
                    f"{name}: training diverged (validation loss {bits} at step {step + 1}); "
                    "nothing was saved; lower `lr`"
                )
            curve.eval_steps.append(step + 1)
            curve.eval_seconds.append(time.perf_counter() - start)
            curve.val_bits_per_char.append(bits)
        if on_step is not None:
            on_step(step + 1, model, curve.train_loss[-1], bits)
        if progress is not None:
            progress(name, step + 1, settings.steps, curve.train_loss[-1], bits)
    model.eval()
    return curve


def train(
    settings: TrainSettings,
    progress: Progress | None = None,
    finish: Callable[[dict[Path, Path]], None] | None = None,
    committed: Callable[[list[Path]], None] | None = None,
) -> list[Curve]:
    """Train the Fastformer (and the baseline), then save every folder as one unit.

    ``finish(staged)`` may add files to the staged folders (``{folder: staging}``)
    before they are put in place (the CLI writes the training report into them);
    ``committed(folders)`` runs the moment they are (see ``probe.files.results.Unit``).
    """
    import hashlib

    settings.check()
    tokenizer = char_tokenizer(settings.text)
    ids = encode(tokenizer, settings.text)
    train_ids, val_ids = split(ids, settings.val_fraction)
    offsets = batch_offsets(len(train_ids), settings)
    sha = hashlib.sha256(settings.text.encode("utf-8")).hexdigest()

    jobs = [("fastformer", fastformer_for, Path(settings.out))]
    if settings.baseline == "gpt2":
        jobs.append(("gpt2", gpt2_for, baseline_folder(settings)))
    data = {"source": settings.text_source, "sha256": sha, "characters": len(ids),
            "val_fraction": settings.val_fraction}  # fmt: skip
    # The series along training (save_every) are staged as the models train; every folder
    # is put in place together at the end, or none is (leaving the block discards them).
    with Unit() as unit:
        trained, savers = [], []
        for name, build, folder in jobs:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(settings.seed)  # same init seed, same dropout stream per model
                model = build(settings, len(tokenizer))
                saver = _saver(unit, name, folder, model, tokenizer, val_ids, settings, data)
                with quiet_transformers():
                    curve = fit(name, model, train_ids, val_ids, offsets, settings, progress, saver)
            check_finite_weights(model, name)
            curve.folder = str(folder)
            trained.append((model.to("cpu"), curve, folder))
            if saver is not None:
                saver.finish(sum(p.numel() for p in model.parameters()))
                savers.append(saver)
        staged = {}
        for model, curve, folder in trained:
            staged[folder] = unit.folder(folder)
            _save(model, tokenizer, staged[folder], folder.name, settings, curve, data)
        if finish is not None:
            finish(staged)
        for staging in [*staged.values(), *(saver.staging for saver in savers)]:
            _follow_umask(staging)
        unit.commit(committed)
    return [curve for _, curve, _ in trained]


def _saver(unit, name, folder, model, tokenizer, val_ids, settings, data) -> StepSaver | None:
    """The checkpoints along training of the model trained into ``folder`` (``save_every``),
    staged in ``unit`` beside their target ``folder-steps``; None without ``save_every``."""
    if settings.save_every is None:
        return None
    target = series_folder(folder)
    need = series_bytes(sum(p.numel() for p in model.parameters()), settings)
    check_space(target.parent, need, f"the checkpoints along training of {name}")
    return StepSaver(
        name,
        unit.folder(target),
        target.name,
        tokenizer,
        settings,
        lambda trained: evaluate(trained, val_ids, settings),
        data,
    )


def check_finite_weights(model, name: str) -> None:
    """A trained model whose weights are not all finite is never saved."""
    for key, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ProbeError(
                f"{name}: training diverged ({key} holds NaN or inf); nothing was saved; lower `lr`"
            )


def _save(model, tokenizer, staging: Path, name: str, settings, curve: Curve, data: dict):
    """Write one checkpoint folder's files into ``staging`` (renamed to ``name`` later)."""
    with quiet_transformers():
        model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    record = {
        "model": curve.name,
        "folder": name,
        "command": settings.command,
        "data": data,
        "settings": settings_record(settings),
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_val_bits_per_char": curve.final_bits_per_char,
        "seconds": curve.seconds[-1],
        "curve": {k: getattr(curve, k) for k in
                  ("steps", "seconds", "train_loss", "eval_steps", "eval_seconds", "val_bits_per_char")},
    }  # fmt: skip
    (staging / TRAINING_FILE).write_text(json.dumps(record, indent=1, default=str) + "\n")


def _follow_umask(folder: Path) -> None:
    """Files as any tool writes them (safetensors creates its file with mode 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).rglob("*"):
        if path.is_file():
            os.chmod(path, 0o666 & ~mask)
