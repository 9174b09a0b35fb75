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
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from ..errors import ProbeError
from ..results import utc_now, versions
from .config import FastformerConfig
from .modeling import FastformerForCausalLM
from .tokenizer import char_tokenizer, encode

BASELINES = ("gpt2",)
TRAINING_FILE = "training.json"

#: (model name, step, total steps, train loss, validation bits/char or None)
Progress = Callable[[str, int, int, float, float | None], None]


@dataclass(frozen=True)
class TrainSettings:
    text: str
    text_source: str
    out: Path
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    context: int = 256
    steps: int = 1000
    batch: int = 16
    lr: float = 1e-3
    warmup: int | None = None  # default: steps // 20
    weight_decay: float = 0.01
    dropout: float = 0.0
    convolve: bool = False
    seed: int = 0
    device: str = "cpu"
    val_fraction: float = 0.1
    eval_every: int | None = None  # default: steps // 10
    eval_windows: int = 64
    baseline: str | None = None
    baseline_out: Path | None = None
    command: str = ""

    def check(self) -> None:
        positive = {
            "--hidden": self.hidden, "--layers": self.layers, "--heads": self.heads,
            "--context": self.context, "--steps": self.steps, "--batch": self.batch,
        }  # fmt: skip
        for flag, value in positive.items():
            if value < 1:
                raise ProbeError(f"{flag} must be at least 1, got {value}")
        if self.hidden % self.heads:
            raise ProbeError(f"--hidden {self.hidden} is not a multiple of --heads {self.heads}")
        if not self.lr > 0:
            raise ProbeError(f"--lr must be positive, got {self.lr}")
        if not 0 <= self.dropout < 1:
            raise ProbeError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.baseline not in (None, *BASELINES):
            raise ProbeError(f"unknown --baseline {self.baseline!r}; choose {', '.join(BASELINES)}")
        if len(self.text) * self.val_fraction < self.context:
            raise ProbeError(
                f"the text has {len(self.text)} characters: too short for a validation split of "
                f"{self.val_fraction:.0%} holding one window of --context {self.context}"
            )

    @property
    def warmup_steps(self) -> int:
        return max(1, self.steps // 20) if self.warmup is None else self.warmup

    @property
    def eval_interval(self) -> int:
        return max(1, self.steps // 10) if self.eval_every is None else self.eval_every


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
        raise ProbeError(f"the training split is shorter than --context {settings.context}")
    return torch.randint(0, high + 1, (settings.steps, settings.batch), generator=gen)


def windows(ids: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """(len(starts), length) windows of ``ids``."""
    return ids[starts[:, None] + torch.arange(length)]


def fastformer_for(settings: TrainSettings, vocab: int) -> FastformerForCausalLM:
    config = FastformerConfig(
        vocab_size=vocab,
        hidden_size=settings.hidden,
        n_heads=settings.heads,
        num_hidden_layers=settings.layers,
        max_position_embeddings=settings.context,
        convolve=settings.convolve,
        hidden_dropout_prob=settings.dropout,
        label_smoothing=0,
        pad_token_id=0,
    )
    return FastformerForCausalLM(config)


def gpt2_for(settings: TrainSettings, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab,
        n_positions=settings.context,
        n_embd=settings.hidden,
        n_layer=settings.layers,
        n_head=settings.heads,
        resid_pdrop=settings.dropout,
        embd_pdrop=settings.dropout,
        attn_pdrop=settings.dropout,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(config)


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
) -> Curve:
    """Train ``model`` in place on the windows at ``offsets``; returns its curve."""
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
    for step in range(settings.steps):
        batch = windows(train_ids, offsets[step], length).to(device)
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        if not torch.isfinite(loss):
            raise ProbeError(
                f"{name}: the loss became {loss.item()} at step {step + 1}; lower --lr"
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
            curve.eval_steps.append(step + 1)
            curve.eval_seconds.append(time.perf_counter() - start)
            curve.val_bits_per_char.append(bits)
        if progress is not None:
            progress(name, step + 1, settings.steps, curve.train_loss[-1], bits)
    model.eval()
    return curve


def train(settings: TrainSettings, progress: Progress | None = None) -> list[Curve]:
    """Train the Fastformer (and the baseline), save each folder; returns their curves."""
    import hashlib

    settings.check()
    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProbeError(
            "--device cuda asked for, but no CUDA device is available; use --device cpu"
        )
    tokenizer = char_tokenizer(settings.text)
    ids = encode(tokenizer, settings.text)
    train_ids, val_ids = split(ids, settings.val_fraction)
    offsets = batch_offsets(len(train_ids), settings)
    sha = hashlib.sha256(settings.text.encode("utf-8")).hexdigest()

    jobs = [("fastformer", fastformer_for, settings.out)]
    if settings.baseline == "gpt2":
        jobs.append(("gpt2", gpt2_for, baseline_folder(settings)))
    curves = []
    for name, build, folder in jobs:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)  # same init seed, same dropout stream per model
            model = build(settings, len(tokenizer))
            with _quiet_transformers():
                curve = fit(name, model, train_ids, val_ids, offsets, settings, progress)
        curve.folder = str(folder)
        _save(model.to("cpu"), tokenizer, folder, settings, curve, sha, len(ids))
        curves.append(curve)
    return curves


def baseline_folder(settings: TrainSettings) -> Path:
    if settings.baseline_out is not None:
        return Path(settings.baseline_out)
    out = Path(settings.out)
    return out.with_name(f"{out.name}-{settings.baseline}")


def _save(model, tokenizer, folder: Path, settings: TrainSettings, curve: Curve, sha, n_chars):
    """Write the checkpoint folder whole: into a sibling temp folder, then renamed into place."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with _quiet_transformers():
            model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        record = {
            "model": curve.name,
            "folder": folder.name,
            "command": settings.command,
            "data": {"source": settings.text_source, "sha256": sha, "characters": n_chars,
                     "val_fraction": settings.val_fraction},
            "settings": {k: v for k, v in asdict(settings).items()
                         if k not in ("text", "out", "baseline_out", "command")},
            "parameters": sum(p.numel() for p in model.parameters()),
            "final_val_bits_per_char": curve.final_bits_per_char,
            "seconds": curve.seconds[-1],
            "curve": {k: getattr(curve, k) for k in
                      ("steps", "seconds", "train_loss", "eval_steps", "eval_seconds", "val_bits_per_char")},
        }  # fmt: skip
        (staging / TRAINING_FILE).write_text(json.dumps(record, indent=1, default=str) + "\n")
        if folder.is_dir():  # replace an earlier checkpoint only once the new one is complete
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
            folder.rename(old)
            staging.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _quiet_transformers():
    """No "Writing model shards" bar or loss-type advice in the middle of the training output."""
    from transformers.utils import logging as hf_logging

    bar, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def read_training(folder: str | Path) -> dict:
    """The ``training.json`` of a folder written by :func:`train`."""
    path = Path(folder) / TRAINING_FILE
    if not path.is_file():
        raise ProbeError(
            f"{folder} has no {TRAINING_FILE}: not a folder written by `probe fastformer train`"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def curves(records: list[dict]) -> xr.Dataset:
    """The training curves of several ``training.json`` records as one Dataset (dims model, step)."""
    names = [r["model"] for r in records]
    steps = max(len(r["curve"]["steps"]) for r in records)
    evals = max(len(r["curve"]["eval_steps"]) for r in records)

    def padded(key, n):
        out = np.full((len(records), n), np.nan)
        for i, r in enumerate(records):
            values = r["curve"][key]
            out[i, : len(values)] = values
        return out

    ds = xr.Dataset(
        {
            "train_loss": (("model", "step"), padded("train_loss", steps)),
            "seconds": (("model", "step"), padded("seconds", steps)),
            "eval_step": (("model", "evaluation"), padded("eval_steps", evals)),
            "eval_seconds": (("model", "evaluation"), padded("eval_seconds", evals)),
            "val_bits_per_char": (("model", "evaluation"), padded("val_bits_per_char", evals)),
        },
        coords={"model": names, "step": np.arange(1, steps + 1), "evaluation": np.arange(evals)},
    )
    ds["train_loss"].attrs["long_name"] = "training loss (nats per character)"
    ds["seconds"].attrs["long_name"] = "wall time since the start of training (s)"
    ds["val_bits_per_char"].attrs["long_name"] = "validation bits per character"
    first = records[0]
    ds.attrs = {
        "analysis": "training",
        "model": " vs ".join(names),
        "command": first["command"],
        "text_source": first["data"]["source"],
        "text_sha256": first["data"]["sha256"],
        "settings": json.dumps(first["settings"]),
        "final_val_bits_per_char": json.dumps(
            {r["model"]: r["final_val_bits_per_char"] for r in records}
        ),
        "parameters": json.dumps({r["model"]: r["parameters"] for r in records}),
        "folders": json.dumps({r["model"]: r.get("folder", "") for r in records}),
        **versions(),
        "created": utc_now(),
    }
    return ds
