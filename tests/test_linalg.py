"""Tests for probe.linalg: the accuracy of its eigensolvers and quadrature against the float64
SVD oracle, and that splitting the work (batches, threads, reused buffers) changes no bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.linalg import gram, lapack, quadrature, top
from probe.measures import metrics
from tests.batches import as_tensor, assert_close, random_batch, torch_metrics
from tests.reference import metrics_numpy as ref

# ------------------------------------------------ accuracy against the float64 SVD oracle
# probe.measures.metrics avoids SVDs (probe.linalg's docstrings); these pin its accuracy to the oracle's on every
# metric, for random, nearly collapsed and nearly rank-one inputs, plain and padded.

ACCURACY_SHAPES = [(3, 16, 40), (3, 40, 16), (2, 19, 30), (2, 128, 768)]  # <, >, odd k, bert
SMALL_RATIO = 1e-6
# Tokens around a common vector, at three distances: 1e-12 (nearly collapsed), 1e-7 (where a
# float32 model's pure-attention layers end up: float32 rounding of the hidden states), 1e-3
# (near the s_2 / s_1 = 1e-2 switch to the deflated spectrum, from both sides).
NOISE = {"collapsed": 1e-12, "float32_floor": 1e-7, "partial": 1e-3}


def accuracy_batch(rng, S, T, H, kind, padded):
    if kind == "random":
        X = rng.standard_normal((S, T, H)) * rng.uniform(0.1, 3.0, (S, T, 1))
        X += rng.standard_normal((S, 1, H))
    elif kind == "identical":  # every token the same vector (a bfloat16 model's SAN layers)
        X = np.ones((S, T, 1)) * rng.standard_normal((S, 1, H))
    elif kind in NOISE:  # X = 1 x^T + noise: mean-fit ratios ~ the noise level
        X = np.ones((S, T, 1)) * rng.standard_normal((S, 1, H))
        X += NOISE[kind] * rng.standard_normal((S, T, H))
    else:  # "rank_one": X = u v^T + 1e-12 noise, svd-fit ratios ~1e-12, mean-fit ones not
        X = rng.standard_normal((S, T, 1)) * rng.standard_normal((S, 1, H))
        X += 1e-12 * rng.standard_normal((S, T, H))
    mask = np.ones((S, T), dtype=bool)
    if padded:
        mask = rng.random((S, T)) > 0.3
        mask[:, rng.choice(T, 2, replace=False)] = True
        X[~mask] = np.nan
    return X, mask


def assert_ratios_match(actual, expected):
    actual = actual.cpu().numpy()
    error = np.abs(actual - expected)
    big = expected > SMALL_RATIO
    # Above 1e-6: relative 1e-10.  The oracle's residual is exact to about eps ||X|| (a
    # backward-stable SVD and a rounded subtraction), so a ratio r carries an error of a few
    # eps / r relative, at most ~1e-10 at r = 1e-6; random inputs sit near 1e-15.
    assert (error[big] <= 1e-10 * expected[big]).all(), error[big].max()
    # Below 1e-6: absolute 1e-14, i.e. ~50 eps of ||X||: the best any float64 method
    # (the oracle included) resolves, and still two digits of a 1e-12 ratio.
    assert (error[~big] <= 1e-14).all(), error[~big].max()


@pytest.mark.parametrize("path", ["dense", "krylov"])
@pytest.mark.parametrize("padded", [False, True], ids=["plain", "padded"])
@pytest.mark.parametrize("kind", ["random", *NOISE, "rank_one", "identical"])
@pytest.mark.parametrize("shape", ACCURACY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_accuracy_against_svd_oracle(shape, kind, padded, path, monkeypatch):
    # Both ways to the top singular pair and the residuals' spectral norms, at the same
    # tolerances: dense eigensolves (a CPU at these k) and the Krylov loop (larger k, CUDA).
    # DENSE_UP_TO is patched where it is read (probe.linalg.top); the spy on the Krylov step
    # checks that the path asked for is the one taken.
    monkeypatch.setattr(top, "DENSE_UP_TO", top.DENSE_UP_TO if path == "dense" else 0)
    steps, krylov_step = [], top.step
    monkeypatch.setattr(top, "step", lambda *a: steps.append(1) or krylov_step(*a))
    X, mask = accuracy_batch(np.random.default_rng(11), *shape, kind, padded)
    expected = ref.collapse_metrics(X, mask)
    actual = torch_metrics(X, mask)
    ratios = expected["relative_residual"]
    mean, svd = metrics.FITS.index("mean"), metrics.FITS.index("svd")
    if kind in NOISE:  # the inputs reach the regime they are meant to test
        assert 0.01 * NOISE[kind] < ratios.max() < 100 * NOISE[kind]
    if kind == "rank_one":
        assert ratios[:, svd].max() < 1e-10 < ratios[:, mean].min()
    if kind == "identical":  # the oracle's own rounding only
        assert ratios.max() < 1e-14
    assert bool(steps) == (path == "krylov")
    assert_ratios_match(actual["relative_residual"], ratios)
    # Effective and stable rank: relative 1e-8.  Their spectra are well conditioned (sums of
    # s_i and s_i^2 dominated by the large ones); rounding moves them by ~1e-15 here.
    for key in ("effective_rank", "stable_rank"):
        assert_close(actual[key], expected[key], rtol=1e-8, atol=0)
    # Cosine: a mean of T^2 dot products of unit vectors, each exact to ~H eps: absolute 1e-13.
    assert_close(actual["cosine_similarity"], expected["cosine_similarity"], rtol=0, atol=1e-13)


def test_identical_tokens_do_not_hold_the_krylov_loop_open(monkeypatch):
    # Sequences whose tokens are all one vector are exactly rank one: G_1 is rounding alone,
    # its run never converges on them, and before they were skipped it went on for all of
    # its min(KRYLOV_STEPS, k) = 128 steps (each check a wait for the device on CUDA).  Now
    # G's run settles at its first check, G_1's starts then and ends at its own first check
    # with nothing to hold it open: twice CHECKS[0] steps.  Beside them a random
    # sequence keeps its own number of steps, and every value matches the SVD oracle.
    monkeypatch.setattr(top, "DENSE_UP_TO", 0)
    steps, krylov_step = [], top.step
    monkeypatch.setattr(top, "step", lambda *a: steps.append(1) or krylov_step(*a))
    rng = np.random.default_rng(5)
    X, mask = accuracy_batch(rng, 3, 128, 200, "identical", padded=True)
    wanted = ("relative_residual", "stable_rank")
    actual = metrics.collapse_metrics(as_tensor(X), torch.as_tensor(mask), wanted)
    assert len(steps) == 2 * top.CHECKS[0]
    assert_ratios_match(
        actual["relative_residual"], ref.collapse_metrics(X, mask)["relative_residual"]
    )
    random, _ = accuracy_batch(rng, 1, 128, 200, "random", padded=False)
    steps.clear()
    metrics.collapse_metrics(as_tensor(random), torch.ones(1, 128, dtype=torch.bool), wanted)
    alone = len(steps)
    steps.clear()
    both = np.concatenate([X[:1], random])
    both_mask = np.concatenate([mask[:1], np.ones((1, 128), dtype=bool)])
    together = metrics.collapse_metrics(as_tensor(both), torch.as_tensor(both_mask), wanted)
    assert len(steps) == alone > 2 * top.CHECKS[0]
    expected = ref.collapse_metrics(both, both_mask)
    assert_ratios_match(together["relative_residual"], expected["relative_residual"])


def test_tokens_in_tight_groups_converge_in_the_krylov_loop(monkeypatch):
    # Tokens in four groups 1e-4 apart around one vector (bfloat16's nearly collapsed
    # layers): lambda_2 / lambda_1 ~ 1e-8, and the Krylov direction that refines u_1 is
    # ~1e-10 of the largest product.  A breakdown threshold of 1e-8 took it for rounding:
    # G's run never converged, 132 steps and the exact eigensolver for every sequence.  Now
    # the loop ends at its first checks (8 steps), with no exact fallback, at the oracle's
    # accuracy.
    monkeypatch.setattr(top, "DENSE_UP_TO", 0)
    steps, krylov_step = [], top.step
    monkeypatch.setattr(top, "step", lambda *a: steps.append(1) or krylov_step(*a))
    exact, exact_top = [], top._exact_top
    monkeypatch.setattr(top, "_exact_top", lambda *a: exact.append(1) or exact_top(*a))
    rng = np.random.default_rng(0)
    S, T, H = 3, 200, 300
    groups = rng.integers(0, 4, (S, T))
    offsets = 3e-3 * rng.standard_normal((S, 4, H))
    X = 30 * rng.standard_normal((S, 1, H)) + np.take_along_axis(
        offsets, groups[..., None].repeat(H, -1), 1
    )
    mask = np.ones((S, T), dtype=bool)
    wanted = ("relative_residual", "stable_rank")
    actual = metrics.collapse_metrics(as_tensor(X), torch.as_tensor(mask), wanted)
    assert len(steps) == 2 * top.CHECKS[0] and not exact
    expected = ref.collapse_metrics(X, mask)
    assert_ratios_match(actual["relative_residual"], expected["relative_residual"])
    assert_close(actual["stable_rank"], expected["stable_rank"], rtol=1e-8, atol=0)


# ------------------------------------------------------------------ how the work is split


def test_dense_path_survives_a_change_of_the_thread_count():
    # After torch.set_num_threads (a user's, or the theory constants' before they ran in
    # probe.linalg.lapack.serial_threads), MKL's batched LU returned pivots of 0 and the
    # dense path's inverse iteration failed ("Pivots given to lu_solve must all be greater
    # or equal to 1").  Impossible pivots now send u_1 to the symmetric eigensolver, which
    # that fault leaves alone: the same values up to rounding (the stated 1e-10 relative).
    threads = torch.get_num_threads()
    generator = torch.Generator().manual_seed(9)
    X = torch.randn(4, 160, 192, generator=generator, dtype=torch.float64)
    X[1] = X[1, :1] + 0.2 * X[1]
    mask = torch.ones(4, 160, dtype=torch.bool)
    mask[3, 70:] = False
    try:
        torch.set_num_threads(2)  # also in a one-thread test worker: the pool is what is tested
        before = metrics.collapse_metrics(X, mask)
        torch.set_num_threads(1)
        torch.set_num_threads(2)
        after = metrics.collapse_metrics(X, mask)
    finally:
        torch.set_num_threads(threads)
    for name, value in before.items():
        assert_close(after[name], value, rtol=1e-10, atol=1e-14)


def test_lapack_split_does_not_change_any_bit():
    # lapack cuts a batch into one piece per thread; every matrix must come out exactly as it
    # does alone, whatever batch it arrives in (so results do not depend on batch size).
    rng = np.random.default_rng(5)
    A = as_tensor(rng.standard_normal((7, 40, 60)))
    G = A @ A.mT
    whole = lapack.lapack(torch.linalg.eigvalsh, G)[0]
    alone = torch.cat([lapack.lapack(torch.linalg.eigvalsh, g[None])[0] for g in G])
    assert torch.equal(whole, alone)
    first, second = lapack.lapack(torch.linalg.eigvalsh, G[:3], G[3:])
    assert torch.equal(torch.cat([first, second]), whole)


def test_same_batch_same_bits_and_batches_agree_to_rounding():
    X, mask = random_batch(np.random.default_rng(8), 5, 24, 40)
    whole = torch_metrics(X, mask)
    again = torch_metrics(X, mask)  # reused buffers and the pool leave nothing behind
    assert all(torch.equal(again[key], whole[key]) for key in whole)
    for s in range(5):
        alone = torch_metrics(X[s : s + 1], mask[s : s + 1])
        # Matmuls and reductions may block a batch of one differently from a batch of five:
        # rounding-level differences (a few eps of these O(1) values), nothing more.
        for key, value in alone.items():
            assert_close(value[0], whole[key][s].numpy(), rtol=1e-13, atol=1e-15)


# ------------------------------------------------------- effective rank: exact and estimate


def hidden_like(rng, S, T, H, kind):
    """Spectra shaped like real hidden states: a Marchenko-Pastur bulk ("bulk"), the same under
    a shared offset and three outlier directions ("outliers", what layers of a random or
    pretrained model look like), that crushed to 1e-3 of a shared token ("partial") or to 1e-8
    ("collapsed", erank ~ 1)."""
    X = rng.standard_normal((S, T, H))
    if kind != "bulk":
        for weight in (30.0, 10.0, 5.0):
            X += weight * rng.standard_normal((S, T, 1)) * rng.standard_normal((S, 1, H))
        X += 20 * rng.standard_normal((S, 1, H))
    shared = np.ones((S, T, 1)) * rng.standard_normal((S, 1, H))
    if kind == "partial":
        X = 10 * shared + 1e-3 * X
    if kind == "collapsed":
        X = shared + 1e-8 * X
    return X


@pytest.mark.parametrize("kind", ["bulk", "outliers", "partial", "collapsed"])
@pytest.mark.parametrize("shape", [(2, 300, 400), (2, 400, 300)], ids=["wide", "tall"])
def test_effective_rank_estimate_against_svd_oracle(shape, kind):
    X, mask = hidden_like(np.random.default_rng(1), *shape, kind), None
    if kind == "outliers":  # padded rows too: the estimate counts real tokens only
        mask = np.ones(shape[:2], dtype=bool)
        mask[:, -37:] = False
        X[~mask] = np.nan
    expected = ref.effective_rank(X, mask)
    Xt, mt = as_tensor(X), None if mask is None else torch.as_tensor(mask)
    estimate = metrics.effective_rank(Xt, mt, method="estimate").numpy()
    # The stated accuracy: relative error within 2% per sequence (stochastic Lanczos quadrature
    # with 16 probes; measured here: 0.02-0.1%); fully collapsed ones, all but s_1 counted
    # exactly or negligible, to 1e-4.
    tolerance = 1e-4 if kind == "collapsed" else 2e-2
    np.testing.assert_allclose(estimate, expected, rtol=tolerance, atol=0)
    # The exact method stays at today's tolerance at sizes "auto" leaves to the estimate.
    exact = metrics.effective_rank(Xt, mt, method="exact")
    assert_close(exact, expected, rtol=1e-8, atol=0)
    # A sequence's estimate barely depends on the batch it came in: the probes are fixed, but a
    # batch of one rounds its matmuls differently, which can tip a borderline Ritz pair in or
    # out of the exactly counted top (measured: up to 4e-6), far below the estimate's own error.
    alone = metrics.effective_rank(Xt[1:], None if mt is None else mt[1:], method="estimate")
    assert_close(alone, estimate[1:], rtol=1e-4, atol=0)


@pytest.mark.parametrize("kind", ["identical", "bfloat16"])
def test_effective_rank_estimate_where_the_residual_is_rounding(kind):
    # Tokens equal to the last bit (a bfloat16 model's collapsed layers): R_1 is rounding
    # alone, the probes see nothing of it, and the control variates' regression once turned
    # the mismatch with its exact (rounding) trace into sums of 1e40: an effective rank at
    # its bound, 128, where the oracle's is 1 (4 of these 32 sequences).  "bfloat16": half the
    # sequences carry noise at bfloat16's last bits, so the estimate has a small spectrum to
    # see beside the identical ones.  Tolerance as for the collapsed kind above: 1e-4.
    rng = np.random.default_rng(3)
    S, T, H = 32, 128, 200
    X = np.ones((S, T, 1)) * rng.standard_normal((S, 1, H))
    if kind == "bfloat16":
        X = as_tensor(X).to(torch.bfloat16).double().numpy()
        noisy = rng.random((S, 1, 1)) < 0.5
        X = X + noisy * 2.0**-12 * rng.standard_normal((S, T, H))
    expected = ref.effective_rank(X, None)
    estimate = metrics.effective_rank(as_tensor(X), method="estimate").numpy()
    np.testing.assert_allclose(estimate, expected, rtol=1e-4, atol=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(1e-150, 1e150)), min_size=1, max_size=40).map(
        sorted
    ),
    st.integers(0, 20),
)
def test_feasible_sums_keep_every_true_spectrum(values, extra):
    # The bounds the estimate's sums are held to (quadrature._feasible) hold for every
    # spectrum: the true sum_i s_i and sum_i s_i log s_i of any d values s_i >= 0 (d counts
    # zeros too: ``extra`` more) are kept as they are, up to the rounding of the bounds
    # themselves (a square root and products: a few eps; 1e-12 relative).
    s = torch.tensor(values, dtype=torch.float64)
    d = torch.tensor(float(len(values) + extra), dtype=torch.float64)
    total, entropy = s.sum(), torch.special.xlogy(s, s).sum()
    kept_total, kept_entropy = quadrature._feasible(total, entropy, s.square().sum(), d)
    assert_close(kept_total, total, rtol=1e-12, atol=0)
    scale = torch.special.xlogy(total, total).abs() + total * d.log()  # the bounds' size
    assert abs(float(kept_entropy - entropy)) <= 1e-12 * float(scale)


def test_effective_rank_estimate_is_not_exact():
    # Guards against the estimate silently being the exact method: at k = 300 they differ.
    X = as_tensor(hidden_like(np.random.default_rng(2), 1, 300, 400, "bulk"))
    estimate = metrics.effective_rank(X, method="estimate")
    exact = metrics.effective_rank(X, method="exact")
    assert 1e-6 < abs(float(estimate / exact) - 1) < 2e-2


@pytest.mark.parametrize("kind", ["outliers", "partial", "rank_one"])
@pytest.mark.parametrize("shape", [(3, 60, 90), (3, 90, 60)], ids=["wide", "tall"])
def test_residual_gram_frobenius_against_svd_oracle(shape, kind, monkeypatch):
    # The estimate's control variate ||G_1||_F^2 = sum_{i>=2} s_i^4, formed through G_R as a
    # difference of terms up to ||M||_F^2, or from R_1 itself where that cancels too much.
    rng = np.random.default_rng(4)
    if kind == "rank_one":  # u v^T with u far from uniform: R is large, R_1 tiny
        X = rng.uniform(0.5, 1.5, shape[:2] + (1,)) * rng.standard_normal((shape[0], 1, shape[2]))
        X += 1e-6 * rng.standard_normal(shape)
    else:
        X = hidden_like(rng, *shape, kind)
    mask = np.ones(shape[:2], dtype=bool)
    mask[1, -7:] = False  # one padded sequence
    X[~mask] = np.nan
    seen, cancelled = [], []
    computed, direct = quadrature.residual_fro2, gram.Grams.fro2_residual

    def spy_direct(grams):
        value, size = direct(grams)
        cancelled.append((value < quadrature.CANCELLED * size).numpy())
        return value, size

    monkeypatch.setattr(gram.Grams, "fro2_residual", spy_direct)
    monkeypatch.setattr(
        quadrature, "residual_fro2", lambda *a: seen.append(computed(*a)) or seen[-1]
    )
    metrics.effective_rank(as_tensor(X), torch.as_tensor(mask), method="estimate")
    expected = [
        (ref.singular_values(ref.real_tokens(X, mask, s))[1:] ** 4).sum() for s in range(shape[0])
    ]
    # The rank-one inputs must take the fallback, and only they (s_2 / s_1 ~ 1e-6 there).
    assert cancelled[0].all() if kind == "rank_one" else not cancelled[0].any()
    # Through G_R: rounding ~eps ||M||_F^2, at most 1e8 eps of the value (CANCELLED) and
    # a few eps here, where the two are of one size (measured 2e-15-9e-15).  From R_1: its
    # entries carry eps s_1, ~2e-10 of s_2 at s_2 / s_1 ~ 1e-6 (measured 1e-11-2e-11).
    assert_close(seen[0], expected, rtol=1e-13 if kind != "rank_one" else 1e-10, atol=0)
