"""Batches of token representations for the tests of probe.measures.metrics and probe.linalg, and the
comparisons they use: random ones with NaN junk in padding, and hypothesis strategies for
Gaussian and small-integer (degenerate) batches."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import torch
from hypothesis import strategies as st

from probe.measures import metrics


def as_tensor(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def assert_close(actual, expected, rtol=1e-10, atol=1e-12):
    if isinstance(actual, torch.Tensor):
        actual = actual.cpu().numpy()
    np.testing.assert_allclose(actual, np.asarray(expected), rtol=rtol, atol=atol, equal_nan=True)


def assert_metrics_close(actual: dict, expected: dict, rtol=1e-10, atol=1e-12):
    assert set(actual) == set(expected)
    for key in expected:
        assert_close(actual[key], expected[key], rtol=rtol, atol=atol)


def scaled(found: dict, factor: float) -> dict:
    """The metrics of ``factor`` X from those of X: all scale-invariant but mu, which is in
    X's units (|factor| times)."""
    return {**found, "mu": found["mu"] * abs(factor)}


def random_batch(rng, S, T, H, pad_prob=0.3):
    """Gaussian tokens with a shared offset (so cosines are not ~0), NaN junk in padding."""
    X = rng.standard_normal((S, T, H)) * rng.uniform(0.1, 3.0, (S, T, 1))
    X += rng.standard_normal((S, 1, H))
    mask = rng.random((S, T)) > pad_prob
    for s in range(S):
        if mask[s].sum() < 2:
            mask[s, rng.choice(T, 2, replace=False)] = True
    X[~mask] = np.nan
    return X, mask


@st.composite
def gaussian_batches(draw, max_seq=3, max_tok=8, max_hidden=8):
    S = draw(st.integers(1, max_seq))
    T = draw(st.integers(2, max_tok))
    H = draw(st.integers(1, max_hidden))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_batch(rng, S, T, H)


@st.composite
def integer_batches(draw):
    """Small-integer entries: zero tokens, zero sequences, repeated tokens and ties are common."""
    S = draw(st.integers(1, 3))
    T = draw(st.integers(2, 6))
    H = draw(st.integers(1, 5))
    X = draw(hnp.arrays(np.float64, (S, T, H), elements=st.sampled_from([-2.0, -1.0, 0.0, 1.0])))
    mask = np.zeros((S, T), dtype=bool)
    for s in range(S):
        mask[s, sorted(draw(st.sets(st.integers(0, T - 1), min_size=2, max_size=T)))] = True
    return X, mask


def torch_metrics(X, mask) -> dict:
    return metrics.collapse_metrics(as_tensor(X), torch.as_tensor(mask))
