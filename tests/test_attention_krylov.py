"""The attention spectrum's block Krylov run (probe.measures.attention_stats.krylov_top_two, used by
``top_two`` from KRYLOV_FROM tokens on) against numpy's float64 SVD on constructed matrices.

The tolerance is the dense path's (tests/test_attention_stats.py): sigma_1 and sigma_2 within
4 T eps sigma_1 of numpy's values, eps the working precision's (the run is in float64 for a
float64 matrix, in float32 for a float32 one, numpy's SVD in float64 on the same entries).  The run accepts a Ritz pair only when its residual r
satisfies r^2 <= (T eps sigma_1 / 4) gap, which by the Kato-Temple bound puts it within
T eps sigma_1 / 6 of the exact value (probe.measures.attention_stats' docstring); the products'
rounding (sums of T terms of a nonnegative matrix, a few sqrt(T) eps sigma_1 in practice) and
numpy's own error fill the rest.  Matrices the run does not certify (a flat or degenerate
top: rank one, every sigma equal, near one-hot rows) go to the dense SVD, so every case must
match whichever path it takes; the decaying ones (causal rows) must be certified, or the test
would only check the fallback.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.measures.attention_stats import KRYLOV_FROM, krylov_top_two, top_two

EPS = float(np.finfo(np.float64).eps)
T = KRYLOV_FROM + 64  # not a power of two


def _rows(logits: np.ndarray, causal: bool) -> np.ndarray:
    """Row-wise softmax of (..., T, T) logits; ``causal``: only keys k <= i."""
    if causal:
        n = logits.shape[-1]
        logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _cases() -> dict[str, tuple[np.ndarray, bool]]:
    """name: ((m, T, T) matrices, whether the Krylov run must certify every one)."""
    rng = np.random.default_rng(29)
    noise = rng.standard_normal((2, T, T))
    padded = _rows(noise[:1, :300, :300], causal=True)
    return {
        "causal-uniform": (_rows(np.zeros((1, T, T)), causal=True), True),  # Cesaro-like
        "causal-random": (_rows(noise, causal=True), True),  # a random-init Llama's layer
        "causal-sharp": (_rows(3 * noise, causal=True), False),  # near one-hot: a flat top
        "causal-padded": (np.pad(padded, ((0, 0), (0, T - 300), (0, T - 300))), True),
        "random": (_rows(0.3 * noise, causal=False), False),  # flat bulk under sigma_1
        "uniform": (np.full((1, T, T), 1 / T), False),  # rank one: sigma_2 = 0
        "identity": (np.eye(T)[None], False),  # every sigma = 1
        "permutation": (np.eye(T)[rng.permutation(T)][None], False),
        "sink": (_rows(np.where(np.arange(T) == 0, 8.0, 0.0) + 0.1 * noise[:1], False), False),
    }


def _held(A: np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray, float]:
    """A as a run of ``dtype`` holds it, the same values in float64, and dtype's eps."""
    held = torch.from_numpy(A).to(dtype)
    return held, held.to(torch.float64).numpy(), float(torch.finfo(dtype).eps)


def _check(A: np.ndarray, sigma_1, sigma_2, eps: float = EPS) -> None:
    for m in range(A.shape[0]):
        want = np.linalg.svd(A[m], compute_uv=False)
        tol = 4 * A.shape[-1] * eps * want[0]
        assert abs(float(sigma_1[m]) - want[0]) <= tol
        assert abs(float(sigma_2[m]) - want[1]) <= tol


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(_cases()))
def test_top_two_from_krylov_against_numpy_svd(case, dtype):
    held, A, eps = _held(_cases()[case][0], dtype)
    certified = _cases()[case][1]
    sigma_1, sigma_2, frobenius = top_two(held)
    _check(A, sigma_1, sigma_2, eps)
    # Each square rounded once to the working precision, summed in float64.
    want = (A**2).sum((-2, -1))
    np.testing.assert_allclose(frobenius.numpy(), want, rtol=eps / 2 + 8 * T * EPS)
    # The CPU's run (a QR and an SVD per matrix) and the one CUDA takes (batched products,
    # the Ritz step from B^T B), here both on the CPU.
    for batched in (False, True):
        sigma, done = krylov_top_two(held, batched)
        assert sigma.dtype == dtype
        if certified:
            assert bool(done.all()), batched
        # What the run certifies is accurate by itself, not only after the dense fallback.
        _check(A[done.numpy()], sigma[done, 0], sigma[done, 1], eps)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batched", [False, True])
def test_a_matrix_gets_the_same_values_alone_and_in_a_batch(batched, dtype):
    """The fixed start block and the per-matrix stopping step: a matrix's values do not
    depend on the batch it came in (nor on the split over threads), bit for bit."""
    A = torch.from_numpy(_cases()["causal-random"][0]).to(dtype)
    both, _ = krylov_top_two(
        torch.cat([A, torch.from_numpy(_cases()["causal-uniform"][0]).to(dtype)]), batched
    )
    alone, _ = krylov_top_two(A[1:], batched)
    assert torch.equal(both[1], alone[0])


@settings(max_examples=8, deadline=None)
@given(
    concentration=st.sampled_from([0.05, 1.0, 50.0]),
    scale=st.sampled_from([0.0, 0.3, 1.0, 3.0]),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**32 - 1),
)
def test_top_two_on_causal_rows_property(concentration, scale, dtype, seed):
    """Causal rows, each a Dirichlet draw times a softmax of scaled noise and renormalised:
    from near-uniform (Cesaro) to near one-hot; within 4 T eps sigma_1 of numpy, eps the
    working precision's."""
    rng = np.random.default_rng(seed)
    n = KRYLOV_FROM
    A = _rows(scale * rng.standard_normal((1, n, n)), causal=True)
    for i in range(n):
        A[0, i, : i + 1] *= rng.dirichlet(np.full(i + 1, concentration))
    A /= np.maximum(A.sum(-1, keepdims=True), 1e-300)
    held, A, eps = _held(A, dtype)
    sigma_1, sigma_2, _ = top_two(held)
    _check(A, sigma_1, sigma_2, eps)
