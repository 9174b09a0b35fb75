"""Toy training as the paper's scripts ran it: schedules, weight decay, the circle's
recurrent skip in training and in the recurrence, shuffling; each against a hand
computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from probe.analyses.toy import CIRCLE_NETWORKS, circle_run
from probe.toy.train import optimizer, train


def _lrs(schedule: str, epochs: int, per_epoch: int, lr: float = 1.0) -> np.ndarray:
    """The learning rate of every optimisation step, (epochs, per_epoch)."""
    param = nn.Parameter(torch.zeros(1))
    opt, after_step, after_epoch = optimizer(
        [param], lr=lr, weight_decay=0.0, schedule=schedule, epochs=epochs, per_epoch=per_epoch
    )
    seen = np.zeros((epochs, per_epoch))
    for e in range(epochs):
        for s in range(per_epoch):
            seen[e, s] = opt.param_groups[0]["lr"]
            opt.step()
            after_step()
        after_epoch()
    return seen


def test_step_schedule_is_the_convex_hull_scripts() -> None:
    seen = _lrs("steps", epochs=70, per_epoch=3)
    # MultiStepLR([15, 30, 40, 50, 60], 0.91), stepped once per epoch: epoch e (0-based)
    # runs at 0.91^(number of milestones <= e).
    for e in range(70):
        drops = sum(e >= m for m in (15, 30, 40, 50, 60))
        np.testing.assert_allclose(seen[e], 0.91**drops, rtol=1e-12)
    assert seen[14, 0] == 1.0 and seen[15, 0] == pytest.approx(0.91)


def test_linear_schedule_is_the_trainers() -> None:
    seen = _lrs("linear", epochs=4, per_epoch=5, lr=3e-4).ravel()
    # get_linear_schedule_with_warmup(0 warm-up steps): step s of 20 runs at lr (1 - s/20).
    np.testing.assert_allclose(seen, 3e-4 * (1 - np.arange(20) / 20), rtol=1e-12)


def test_constant_schedule_and_weight_decay() -> None:
    assert np.all(_lrs("constant", epochs=3, per_epoch=4, lr=0.5) == 0.5)
    param = nn.Parameter(torch.ones(1))
    opt, _, _ = optimizer(
        [param], lr=0.1, weight_decay=1e-3, schedule="constant", epochs=1, per_epoch=1
    )
    # L2 weight decay as in torch.optim.Adam: the gradient becomes g + wd * p; with g = 0
    # the first Adam step is lr * sign(wd * p) = 0.1 (m / sqrt(v) = 1 at step 1).
    param.grad = torch.zeros(1)
    opt.step()
    assert float(param.detach()) == pytest.approx(1 - 0.1, abs=1e-6)
    with pytest.raises(ValueError, match="schedule"):
        optimizer([param], lr=0.1, weight_decay=0, schedule="cosine", epochs=1, per_epoch=1)


class _Recorder(nn.Module):
    """Returns zeros shaped like its input (plus a parameter, so there is a gradient)
    and records every input it is trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return x * self.w


def test_previous_input_adds_the_previous_batch() -> None:
    """The paper's --circle_skip training: batch k is fed x_k + x_{k-1}, the first batch of
    every epoch x_0 + 0; the last, shorter batch takes the first rows of the previous one."""
    x = torch.arange(7 * 2 * 2, dtype=torch.float64).reshape(7, 2, 2)
    rec = _Recorder().double()
    train(rec, x, torch.zeros_like(x), epochs=2, batch_size=3, lr=0.1, loss="squared-error",
          previous_input=True)  # fmt: skip
    batches = [x[0:3], x[3:6], x[6:7]]
    want = [batches[0], batches[1] + batches[0], batches[2] + batches[1][:1]] * 2
    assert len(rec.seen) == 6
    for got, expected in zip(rec.seen, want, strict=True):
        assert torch.equal(got, expected)
    plain = _Recorder().double()
    train(plain, x, torch.zeros_like(x), epochs=1, batch_size=3, lr=0.1, loss="squared-error")
    assert all(torch.equal(g, b) for g, b in zip(plain.seen, batches, strict=True))


def test_shuffle_is_seeded_and_covers_every_item() -> None:
    x = torch.arange(10, dtype=torch.float64).reshape(10, 1, 1)

    def order(seed):
        rec = _Recorder().double()
        train(rec, x, torch.zeros_like(x), epochs=2, batch_size=4, lr=0.1,
              loss="squared-error", shuffle=True, seed=seed)  # fmt: skip
        return [torch.cat(rec.seen[i : i + 3]).ravel().tolist() for i in (0, 3)]

    first, second = order(0)
    assert sorted(first) == sorted(second) == list(range(10))  # every item once per epoch
    assert first != second  # a fresh order each epoch
    assert order(0) == [first, second] and order(1) != [first, second]


class _Half(nn.Module):
    def forward(self, s):
        return -0.5 * s


def test_circle_recurrence_by_hand() -> None:
    start = torch.tensor([[1.0, 2.0], [-3.0, 4.0]], dtype=torch.float64)
    steps = 6
    # Without the recurrent skip: s_t = f(s_{t-1}) = (-1/2)^t s_0, and s_t is drawn.
    plain = circle_run(_Half(), start, steps, recurrent_skip=False)
    for t in range(steps + 1):
        np.testing.assert_allclose(plain[t], (-0.5) ** t * start.numpy(), rtol=0, atol=0)
    # With it (the paper's +skip): s_t = s_{t-1} + f(s_{t-1}) = (1/2)^t s_0, and the drawn
    # point is f(s_{t-1}) = -(1/2)^t s_0 (step 0: the start).
    skip = circle_run(_Half(), start, steps, recurrent_skip=True)
    np.testing.assert_array_equal(skip[0], start.numpy())
    for t in range(1, steps + 1):
        np.testing.assert_allclose(skip[t], -(0.5**t) * start.numpy(), rtol=0, atol=0)


def test_circle_networks_per_setup() -> None:
    paper, strict = CIRCLE_NETWORKS["paper"], CIRCLE_NETWORKS["strict"]
    # The paper: every network keeps the attention skip; +skip is across recurrent steps.
    assert all(attn_skip for attn_skip, _, _ in paper.values())
    assert paper["SAN+skip"] == (True, False, True) and paper["SAN+MLP"] == (True, True, False)
    # probe's stricter definitions: no skip anywhere in SAN, no attention skip with the MLP,
    # and its "+skip" is the attention skip, which is the paper's plain SAN.
    assert strict["SAN"] == (False, False, False) and strict["SAN+MLP"] == (False, True, False)
    assert strict["SAN+skip"] == paper["SAN"]
    assert not any(recurrent for _, _, recurrent in strict.values())
