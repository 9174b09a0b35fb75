"""Training and path evaluation of the toy networks.

Training is Adam on mini-batches, as in the paper's scripts: sort, convex hull
and circle take their batches in order (no shuffling) at a constant learning
rate, except that convex hull adds an L2 weight decay of 1e-3 and multiplies
the learning rate by 0.91 after epochs 15, 30, 40, 50 and 60 (``schedule=
"steps"``); memorization goes through HuggingFace's Trainer, which shuffles
every epoch, decays the learning rate linearly to 0 over all steps
(``"linear"``) and clips the gradient norm at 1.  A seed fixes everything: the
initial weights and dropout come from ``torch.manual_seed(seed)`` and the
shuffled order from a generator seeded with it.

``previous_input=True`` is the circle's "+skip" training (the paper's
``circle_skip`` option): the network sees each batch plus the previous batch's
inputs (zeros for the first batch of an epoch), the residual across recurrent
steps it is then run with.

Path evaluation (Section 4 of the paper): for each length k = 0..L, draw
``n_paths`` uniform random paths of length k (probe.measures.path_vocabulary.random_paths), run the
network restricted to their sum, and score it; repeat ``repeats`` times with
fresh paths.  The seed of repeat r at length k is derived from the run's seed,
so the drawn paths are reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from probe.errors import ProbeError
from probe.measures.path_vocabulary import path_str, random_paths

from .model import ToySAN

Progress = Callable[[int, int, str], None]

#: The paper's convex-hull schedule: epochs after which the learning rate is multiplied by 0.91.
STEP_MILESTONES, STEP_GAMMA = (15, 30, 40, 50, 60), 0.91


def _quiet(done: int, total: int, label: str) -> None:
    return None


def optimizer(
    params, *, lr: float, weight_decay: float, schedule: str, epochs: int, per_epoch: int
) -> tuple[torch.optim.Adam, Callable[[], None], Callable[[], None]]:
    """(Adam, call after each optimisation step, call after each epoch) for ``schedule``.

    "constant": lr throughout; "steps": lr x 0.91 after epochs 15, 30, 40, 50, 60 (the
    convex-hull script's MultiStepLR, stepped per epoch); "linear": lr (1 - s / S) at step
    s of S (the Trainer's linear schedule without warm-up, stepped per batch).
    ``weight_decay`` is Adam's L2 term (added to the gradient), as the paper's scripts use.
    """
    opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    nothing = lambda: None  # noqa: E731
    if schedule == "constant":
        return opt, nothing, nothing
    if schedule == "steps":
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, list(STEP_MILESTONES), STEP_GAMMA)
        return opt, nothing, sched.step
    if schedule == "linear":
        total = epochs * per_epoch
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1 - step / total))
        return opt, sched.step, nothing
    raise ValueError(f"unknown schedule {schedule!r}")


def train(
    model: ToySAN,
    x: Tensor,
    y: Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    loss: str = "cross-entropy",
    weight_decay: float = 0.0,
    schedule: str = "constant",
    clip: float | None = None,
    shuffle: bool = False,
    previous_input: bool = False,
    seed: int = 0,
    progress: Progress = _quiet,
    label: str = "training",
) -> np.ndarray:
    """Train in place; the mean loss per sequence of every epoch, shape (epochs,).

    ``loss``: "cross-entropy" (mean over tokens) or "squared-error" (summed over the
    batch, as the paper's circle script does).  See the module docstring for the rest.
    """
    per_epoch = -(-len(x) // batch_size)
    opt, after_step, after_epoch = optimizer(
        model.parameters(), lr=lr, weight_decay=weight_decay, schedule=schedule,
        epochs=epochs, per_epoch=per_epoch,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = np.zeros(epochs)
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=generator) if shuffle else None
        total_loss, previous = 0.0, torch.zeros_like(x[:batch_size])
        for start in range(0, len(x), batch_size):
            if order is None:
                xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            else:
                idx = order[start : start + batch_size].to(x.device)
                xb, yb = x[idx], y[idx]
            inputs = xb + previous[: len(xb)] if previous_input else xb
            previous = xb
            out = model(inputs)
            if loss == "cross-entropy":
                value = nn.functional.cross_entropy(out.flatten(0, -2), yb.flatten())
                total_loss += value.item() * len(xb)
            else:
                value = ((out - yb) ** 2).sum()
                total_loss += value.item()
            if not torch.isfinite(value):
                raise ProbeError(
                    f"{label}: training diverged (the loss became {value.item()} in epoch "
                    f"{epoch + 1}); nothing was saved; lower `lr`"
                )
            opt.zero_grad()
            value.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            after_step()
        after_epoch()
        losses[epoch] = total_loss / len(x)
        progress(epoch + 1, epochs, f"{label} (loss {losses[epoch]:.3g})")
    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            raise ProbeError(
                f"{label}: training diverged ({name} holds NaN or inf); nothing was saved; lower `lr`"
            )
    model.eval()
    return losses


def accuracy(logits: Tensor, y: Tensor) -> float:
    """Fraction of tokens whose arg-max class is the target."""
    return float((logits.argmax(-1) == y).double().mean())


def baselines(y_train: Tensor, y_eval: Tensor) -> dict[str, float]:
    """Accuracy on the evaluation targets of two predictors that ignore the input.

    ``majority``: the most frequent training label everywhere; ``position``: at
    each position, the most frequent training label at that position.
    """
    classes = int(max(y_train.max(), y_eval.max())) + 1
    overall = torch.bincount(y_train.flatten(), minlength=classes).argmax()
    per_position = torch.stack(
        [torch.bincount(col, minlength=classes).argmax() for col in y_train.T]
    )
    return {
        "majority": float((y_eval == overall).double().mean()),
        "position": float((y_eval == per_position).double().mean()),
    }


def path_seed(seed: int, length: int, repeat: int) -> int:
    """The seed of the paths of one (length, repeat) cell, derived from the run's seed."""
    return (seed * 1_000_003 + length * 10_007 + repeat) % 2**63


@torch.no_grad()
def path_accuracy(
    model: ToySAN,
    x: Tensor,
    y: Tensor,
    *,
    n_paths: int,
    repeats: int,
    seed: int,
    sub_path: bool,
    attention: str = "own",
    norm: str = "paper",
    progress: Progress = _quiet,
) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy (L+1, repeats), the paths as text (L+1, repeats, n_paths))."""
    depth, heads = model.cfg.depth, model.cfg.heads
    acc = np.zeros((depth + 1, repeats))
    names = np.empty((depth + 1, repeats, n_paths), dtype=object)
    total = (depth + 1) * repeats
    model.eval()  # no dropout while paths are scored
    full = model.trace(x)  # attention and statistics of the full model, shared by all draws
    for k in range(depth + 1):
        for r in range(repeats):
            paths = random_paths(depth, heads, k, n_paths, path_seed(seed, k, r))
            logits = model.forward_paths(x, paths, sub_path, full, attention, norm)
            acc[k, r] = accuracy(logits, y)
            names[k, r] = [path_str(p) for p in paths]
            progress(k * repeats + r + 1, total, f"paths of length {k}")
    return acc, names.astype(str)
