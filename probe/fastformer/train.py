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
(:class:`probe.results.Unit`): concurrent runs into one folder put their results in
place one after the other, never mixed, and a folder of a killed run is removed by the
next one.  ``TrainSettings.check`` refuses what cannot fit in memory before any of it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from .. import checks, memory
from ..errors import ProbeError
from ..names import BASELINES
from ..results import Unit, utc_now, versions
from .config import FastformerConfig
from .modeling import FastformerForCausalLM
from .tokenizer import char_tokenizer, encode

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
        """Every setting in its domain (``probe.checks``, the CLI's own), the text long
        enough, the folders distinct, and the run's memory within the device's."""
        self.check_options()
        if len(self.text) * self.val_fraction < self.context:
            raise ProbeError(
                f"the text has {len(self.text)} characters: too short for a validation split of "
                f"{self.val_fraction:.0%} holding one window of --context {self.context}"
            )
        self.check_memory()

    def check_options(self) -> None:
        """The checks that need no text: numbers, device, folders."""
        positive = {
            "--hidden": self.hidden, "--layers": self.layers, "--heads": self.heads,
            "--context": self.context, "--steps": self.steps, "--batch": self.batch,
        }  # fmt: skip
        for flag, value in positive.items():
            checks.integer(flag, value, 2 if flag == "--context" else 1)
        for flag, value in {"--warmup": self.warmup, "--eval-every": self.eval_every}.items():
            if value is not None:
                checks.integer(flag, value, 0 if flag == "--warmup" else 1)
        checks.integer("--seed", self.seed, 0, checks.MAX_SEED)
        if self.hidden % self.heads:
            raise ProbeError(f"--hidden {self.hidden} is not a multiple of --heads {self.heads}")
        checks.real("--lr", self.lr, 0, MAX_LR, low_open=True)
        checks.real("--dropout", self.dropout, 0, 1, high_open=True)
        checks.device(self.device)
        if self.baseline not in (None, *BASELINES):
            raise ProbeError(f"unknown --baseline {self.baseline!r}; choose {', '.join(BASELINES)}")
        if self.baseline is not None:
            ours, theirs = Path(self.out).resolve(), baseline_folder(self).resolve()
            if ours == theirs or ours in theirs.parents or theirs in ours.parents:
                raise ProbeError(
                    f"--baseline-out {baseline_folder(self)} and --out {self.out} are the same "
                    "folder or one holds the other; give the baseline a folder of its own"
                )

    def check_memory(self) -> None:
        """Refuse a run whose models, optimiser states, activations, batches and curves
        cannot fit (``probe.memory``); the model sizes come from meta-device builds."""
        vocab = len(set(self.text)) + 2  # the characters, <pad> and <unk>
        builds = [fastformer_for] + ([gpt2_for] if self.baseline == "gpt2" else [])
        params = max(_meta_parameters(build, self, vocab) for build in builds)
        b, t, h = self.batch, self.context, self.hidden
        need = (
            params * 4 * 4  # weights, gradients, AdamW's two moments (float32)
            + TRAIN_ACTIVATIONS * b * t * h * self.layers * 4  # kept for the backward pass
            + 3 * b * self.heads * t * t * self.layers * 4  # GPT-2's attention, kept likewise
            + 3 * b * t * vocab * 4  # logits, their softmax and gradient
            + self.steps * self.batch * 8  # every step's window offsets, drawn up front
            + self.steps * CURVE_BYTES_PER_STEP
            + len(self.text) * 8 * 2  # the text as ids (and its split)
        )
        memory.require(
            need,
            self.device,
            f"training width {h}, depth {self.layers}, {self.steps} steps of {b} windows of {t}",
            "use fewer --steps, --batch, --context, --hidden or --layers",
        )

    @property
    def warmup_steps(self) -> int:
        return max(1, self.steps // 20) if self.warmup is None else self.warmup

    @property
    def eval_interval(self) -> int:
        return max(1, self.steps // 10) if self.eval_every is None else self.eval_every


#: The largest peak learning rate accepted: beyond it AdamW only diverges.
MAX_LR = 1.0
#: Activations one layer keeps for the backward pass, in units of batch x context x hidden
#: (attention inputs, pooled vectors, MLP hidden at 4x width, norms, dropout masks).
TRAIN_ACTIVATIONS = 24
#: What each step adds to the curves: three Python floats (24 bytes) and three list slots.
CURVE_BYTES_PER_STEP = 3 * (24 + 8)


def _meta_parameters(build, settings: TrainSettings, vocab: int) -> int:
    """The parameter count of ``build(settings, vocab)``, built on the meta device.

    Sizes whose weights alone would take terabytes are not built (torch cannot even size
    such tensors): their count is the closed form of a GPT-2-like layer stack, which is
    enough to refuse them.
    """
    h, layers = settings.hidden, settings.layers
    rough = layers * 16 * h * h + 2 * vocab * h + settings.context * h
    if rough > 2**40:
        return rough
    # Both models are a stack of identical layers: one layer and two give the count of
    # any depth, without building millions of layers (--layers 8637214 took minutes).
    one, two = (_built_parameters(build, replace(settings, layers=n), vocab) for n in (1, 2))
    return one + (layers - 1) * (two - one)


def _built_parameters(build, settings: TrainSettings, vocab: int) -> int:
    with torch.device("meta"), _quiet_transformers():
        try:
            model = build(settings, vocab)
        except Exception as err:  # a config transformers rejects
            raise ProbeError(
                f"cannot build the model: {' '.join(str(err).split())[:300]}"
            ) from None
    return sum(p.numel() for p in model.parameters())


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
                f"{name}: training diverged (the loss became {loss.item()} at step {step + 1}); "
                "nothing was saved; lower --lr"
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
                    "nothing was saved; lower --lr"
                )
            curve.eval_steps.append(step + 1)
            curve.eval_seconds.append(time.perf_counter() - start)
            curve.val_bits_per_char.append(bits)
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
    ``committed(folders)`` runs the moment they are (see ``probe.results.Unit``).
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
    trained = []
    for name, build, folder in jobs:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)  # same init seed, same dropout stream per model
            model = build(settings, len(tokenizer))
            with _quiet_transformers():
                curve = fit(name, model, train_ids, val_ids, offsets, settings, progress)
        check_finite_weights(model, name)
        curve.folder = str(folder)
        trained.append((model.to("cpu"), curve, folder))
    with Unit() as unit:
        staged = {}
        for model, curve, folder in trained:
            staged[folder] = unit.folder(folder)
            _save(model, tokenizer, staged[folder], folder.name, settings, curve, sha, len(ids))
        if finish is not None:
            finish(staged)
        for staging in staged.values():
            _follow_umask(staging)
        unit.commit(committed)
    return [curve for _, curve, _ in trained]


def check_finite_weights(model, name: str) -> None:
    """A trained model whose weights are not all finite is never saved."""
    for key, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ProbeError(
                f"{name}: training diverged ({key} holds NaN or inf); nothing was saved; lower --lr"
            )


def baseline_folder(settings: TrainSettings) -> Path:
    if settings.baseline_out is not None:
        return Path(settings.baseline_out)
    out = Path(settings.out)
    return out.with_name(f"{out.name}-{settings.baseline}")


def _save(model, tokenizer, staging: Path, name: str, settings, curve: Curve, sha, n_chars):
    """Write one checkpoint folder's files into ``staging`` (renamed to ``name`` later)."""
    with _quiet_transformers():
        model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    record = {
        "model": curve.name,
        "folder": name,
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


def _follow_umask(folder: Path) -> None:
    """Files as any tool writes them (safetensors creates its file with mode 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).rglob("*"):
        if path.is_file():
            os.chmod(path, 0o666 & ~mask)


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
    """The ``training.json`` of a folder written by :func:`train`, checked field by field."""
    path = Path(folder) / TRAINING_FILE
    if not path.is_file():
        raise ProbeError(
            f"{folder} has no {TRAINING_FILE}: not a folder written by `probe fastformer train`"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ProbeError(f"{path} is damaged ({_short(err)}); train again") from None
    problem = _record_problem(record)
    if problem:
        raise ProbeError(f"{path} is damaged ({problem}); train again")
    return record


_CURVE_PAIRS = (
    ("steps", "seconds", "train_loss"),
    ("eval_steps", "eval_seconds", "val_bits_per_char"),
)


def _record_problem(record) -> str:
    """What is wrong with a training record, or "" (the fields the report reads)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for key, kind in (("model", str), ("command", str), ("data", dict), ("settings", dict),
                      ("curve", dict), ("parameters", int), ("final_val_bits_per_char", float)):  # fmt: skip
        value = record.get(key)
        ok = (
            isinstance(value, int | float) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind)
        )
        if not ok:
            return f"'{key}' is missing or not a {kind.__name__}"
    if not all(isinstance(record["data"].get(k), str) for k in ("source", "sha256")):
        return "'data' lacks its source or sha256"
    for keys in _CURVE_PAIRS:
        lists = [record["curve"].get(k) for k in keys]
        for key, values in zip(keys, lists, strict=True):
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            ):
                return f"curve '{key}' is not a non-empty list of numbers"
        if len({len(v) for v in lists}) != 1:
            return f"curves {', '.join(keys)} differ in length"
    return ""


def _short(err: BaseException) -> str:
    return " ".join(str(err).split())[:200]


def curves(records: list[dict]) -> xr.Dataset:
    """The training curves of several ``training.json`` records as one Dataset (dims model, step)."""
    names = [r["model"] for r in records]
    if len(set(names)) < len(names):  # two Fastformers side by side: tell them apart
        names = [f"{r['model']} ({r.get('folder', i)})" for i, r in enumerate(records)]
    if len(set(names)) < len(names):
        names = [f"{name} #{i + 1}" for i, name in enumerate(names)]
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
            "final_val_bits_per_char": (
                ("model",),
                np.array([r["final_val_bits_per_char"] for r in records], dtype=np.float64),
            ),
            "parameters": (("model",), np.array([r["parameters"] for r in records], np.int64)),
        },
        coords={"model": names, "step": np.arange(1, steps + 1), "evaluation": np.arange(evals)},
    )
    ds["train_loss"].attrs["long_name"] = "training loss (nats per character)"
    ds["seconds"].attrs["long_name"] = "wall time since the start of training (s)"
    ds["val_bits_per_char"].attrs["long_name"] = "validation bits per character"
    ds["final_val_bits_per_char"].attrs["long_name"] = "validation bits per character at the end"
    ds["parameters"].attrs["long_name"] = "parameters of the model"
    first = records[0]
    ds.attrs = {
        "analysis": "training",
        "model": " vs ".join(names),
        "command": first["command"],
        "text_source": first["data"]["source"],
        "text_sha256": first["data"]["sha256"],
        "settings": json.dumps(first["settings"]),
        "folders": json.dumps(
            {n: r.get("folder", "") for n, r in zip(names, records, strict=True)}
        ),
        **versions(),
        "created": utc_now(),
    }
    return ds
