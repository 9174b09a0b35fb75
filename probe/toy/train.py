"""Training and path evaluation of the toy networks.

Training is plain Adam on mini-batches taken in order (no shuffling, as in the
paper's scripts), so a seed fixes everything: the initial weights come from
``torch.manual_seed(seed)`` and the batches from the data.

Path evaluation (Section 4 of the paper): for each length k = 0..L, draw
``n_paths`` uniform random paths of length k (probe.paths.random_paths), run the
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
from probe.paths import path_str, random_paths

from .model import ToySAN

Progress = Callable[[int, int, str], None]


def _quiet(done: int, total: int, label: str) -> None:
    return None


def train(
    model: ToySAN,
    x: Tensor,
    y: Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    loss: str = "cross-entropy",
    progress: Progress = _quiet,
    label: str = "training",
) -> np.ndarray:
    """Train in place; the mean loss of every epoch, shape (epochs,)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = np.zeros(epochs)
    batches = range(0, len(x), batch_size)
    for epoch in range(epochs):
        total = 0.0
        for start in batches:
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            out = model(xb)
            if loss == "cross-entropy":
                value = nn.functional.cross_entropy(out.flatten(0, -2), yb.flatten())
            else:  # summed squared error per sequence, averaged over the batch
                value = ((out - yb) ** 2).sum() / len(xb)
            if not torch.isfinite(value):
                raise ProbeError(
                    f"{label}: training diverged (the loss became {value.item()} in epoch "
                    f"{epoch + 1}); nothing was saved; lower --lr"
                )
            opt.zero_grad()
            value.backward()
            opt.step()
            total += value.item() * len(xb)
        losses[epoch] = total / len(x)
        progress(epoch + 1, epochs, f"{label} (loss {losses[epoch]:.3g})")
    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            raise ProbeError(
                f"{label}: training diverged ({name} holds NaN or inf); nothing was saved; lower --lr"
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
    progress: Progress = _quiet,
) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy (L+1, repeats), the paths as text (L+1, repeats, n_paths))."""
    depth, heads = model.cfg.depth, model.cfg.heads
    acc = np.zeros((depth + 1, repeats))
    names = np.empty((depth + 1, repeats, n_paths), dtype=object)
    total = (depth + 1) * repeats
    full = model.trace(x)  # attention and statistics of the full model, shared by all draws
    for k in range(depth + 1):
        for r in range(repeats):
            paths = random_paths(depth, heads, k, n_paths, path_seed(seed, k, r))
            acc[k, r] = accuracy(model.forward_paths(x, paths, sub_path=sub_path, full=full), y)
            names[k, r] = [path_str(p) for p in paths]
            progress(k * repeats + r + 1, total, f"paths of length {k}")
    return acc, names.astype(str)
