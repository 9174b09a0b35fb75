"""The settings of a Fastformer training run, their checks, and the models they build.

``TrainSettings`` holds one run of ``probe.fastformer.train.train``: the text, the
folders, the sizes, the optimiser's settings and the baseline.  ``check`` puts every
setting in its domain (``probe.requests.checks``, the CLI's own bounds), requires a text long
enough for its validation split, keeps the baseline's folder apart from the
Fastformer's, and refuses a run whose weights, optimiser states, activations, batches
and curves cannot fit in memory (``probe.requests.memory``).  The parameter counts behind that
bound come from meta-device builds of the two models (``fastformer_for``,
``gpt2_for``): one layer and two give the count of any depth.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from probe.requests import checks, memory

from ..errors import ProbeError
from ..names import BASELINES
from .config import FastformerConfig
from .modeling import FastformerForCausalLM
from .train_steps import LOG, SAVE_DTYPES, series_folder


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
    save_every: int | str | None = None  # N, or "log": checkpoints along training
    save_dtype: str = "float32"  # the dtype those checkpoints are stored in

    def check(self) -> None:
        """Every setting in its domain (``probe.requests.checks``, the CLI's own), the text long
        enough, the folders distinct, and the run's memory within the device's."""
        self.check_options()
        if len(self.text) * self.val_fraction < self.context:
            raise ProbeError(
                f"the text has {len(self.text)} characters: too short for a validation split of "
                f"{self.val_fraction:.0%} holding one window of `context` {self.context}"
            )
        self.check_memory()

    def check_options(self) -> None:
        """The checks that need no text: numbers, device, folders."""
        positive = {
            "`hidden`": self.hidden, "`layers`": self.layers, "`heads`": self.heads,
            "`context`": self.context, "`steps`": self.steps, "`batch`": self.batch,
        }  # fmt: skip
        for name, value in positive.items():
            checks.integer(name, value, 2 if name == "`context`" else 1)
        for name, value in {"`warmup`": self.warmup, "`eval_every`": self.eval_every}.items():
            if value is not None:
                checks.integer(name, value, 0 if name == "`warmup`" else 1)
        checks.integer("`seed`", self.seed, 0, checks.MAX_SEED)
        if self.hidden % self.heads:
            raise ProbeError(f"`hidden` {self.hidden} is not a multiple of `heads` {self.heads}")
        checks.real("`lr`", self.lr, 0, MAX_LR, low_open=True)
        checks.real("`dropout`", self.dropout, 0, 1, high_open=True)
        checks.device(self.device)
        if self.baseline not in (None, *BASELINES):
            raise ProbeError(f"unknown `baseline` {self.baseline!r}; choose {', '.join(BASELINES)}")
        if self.baseline is not None:
            ours, theirs = Path(self.out).resolve(), baseline_folder(self).resolve()
            if _overlap(ours, theirs):
                raise ProbeError(
                    f"`baseline_out` {baseline_folder(self)} and `out` {self.out} are the same "
                    "folder or one holds the other; give the baseline a folder of its own"
                )
        self.check_saving()

    def check_saving(self) -> None:
        """``save_every`` N or "log", ``save_dtype`` one of :data:`SAVE_DTYPES`, and each
        series folder (``folder-steps``) apart from every folder the run writes."""
        if self.save_every is None:
            return
        every = self.save_every
        if every != LOG and not (
            isinstance(every, int)
            and not isinstance(every, bool)
            and 1 <= every <= checks.MAX_COUNT
        ):
            raise ProbeError(
                f"`save_every` must be a whole number from 1 to {checks.MAX_COUNT}, or {LOG!r}; "
                f"got {checks.shown(every)}"
            )
        if self.save_dtype not in SAVE_DTYPES:
            raise ProbeError(
                f"unknown `save_dtype` {self.save_dtype!r}; choose {', '.join(SAVE_DTYPES)}"
            )
        folders = [Path(self.out)] + ([baseline_folder(self)] if self.baseline else [])
        written = folders + [series_folder(f) for f in folders]
        for i, one in enumerate(written):
            for other in written[i + 1 :]:
                if _overlap(one.resolve(), other.resolve()):
                    raise ProbeError(
                        f"{one} and {other} overlap, and the run writes both (the checkpoints "
                        "along training go beside each model's folder, as FOLDER-steps); "
                        "give `out` and `baseline_out` names apart"
                    )

    def check_memory(self) -> None:
        """Refuse a run whose models, optimiser states, activations, batches and curves
        cannot fit (``probe.requests.memory``); the model sizes come from meta-device builds."""
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
            + (params * 4 if self.save_every is not None else 0)  # a checkpoint's copy
        )
        memory.require(
            need,
            self.device,
            f"training width {h}, depth {self.layers}, {self.steps} steps of {b} windows of {t}",
            "use fewer `steps`, `batch`, `context`, `hidden` or `layers`",
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
    # any depth, without building millions of layers (layers=8637214 took minutes).
    one, two = (_built_parameters(build, replace(settings, layers=n), vocab) for n in (1, 2))
    return one + (layers - 1) * (two - one)


def _built_parameters(build, settings: TrainSettings, vocab: int) -> int:
    with torch.device("meta"), quiet_transformers():
        try:
            model = build(settings, vocab)
        except Exception as err:  # a config transformers rejects
            raise ProbeError(
                f"cannot build the model: {' '.join(str(err).split())[:300]}"
            ) from None
    return sum(p.numel() for p in model.parameters())


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


def _overlap(one: Path, other: Path) -> bool:
    """The same folder, or one holds the other."""
    return one == other or one in other.parents or other in one.parents


def baseline_folder(settings: TrainSettings) -> Path:
    if settings.baseline_out is not None:
        return Path(settings.baseline_out)
    out = Path(settings.out)
    return out.with_name(f"{out.name}-{settings.baseline}")


@contextlib.contextmanager
def quiet_transformers():
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
