"""probe.measures.attention_stats against values computed by hand on constructed matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.errors import ProbeError
from probe.measures.attention_stats import (
    EPSILON,
    Totals,
    check_epsilon,
    head_sums,
    sink_head_share,
    sink_rate,
    top_two,
)
from probe.measures.hidden_stats import anisotropy_sums, lower_median, massive_sums

F64 = torch.float64


def _batch():
    """Two sequences, one head, three tokens; the second has its last token padded (its row
    and column hold garbage that must not count)."""
    a0 = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]  # causal rows
    a1 = [[1.0, 0.0, 9.0], [0.25, 0.75, 9.0], [9.0, 9.0, 9.0]]
    probs = torch.tensor([[a0], [a1]], dtype=F64)  # (2, 1, 3, 3)
    real = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return probs, real


def _h(*p: float) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_received_entropy_sink_and_top_key_by_hand():
    probs, real = _batch()
    sums = head_sums(probs, real)
    totals = Totals(1)
    totals.add_heads(1, sums)
    got = totals.attention()
    # Sequence 0: column means over its 3 rows; sequence 1: over its 2 real rows.
    r0 = [(1 + 0.5 + 0.2) / 3, (0.5 + 0.3) / 3, 0.5 / 3]
    r1 = [(1 + 0.25) / 2, 0.75 / 2, 0.0]
    received = [(a + b) / 2 for a, b in zip(r0, r1, strict=True)]
    # Sums of a few float64 terms divided once: within 4 ulps of the hand value.
    assert float(got["sink_score"][0, 0]) == pytest.approx(received[0], rel=1e-15)
    assert int(got["top_key"][0, 0]) == 0
    assert float(got["top_key_score"][0, 0]) == pytest.approx(received[0], rel=1e-15)
    torch.testing.assert_close(
        sums["received"][0] / 2, torch.tensor(received, dtype=F64), rtol=1e-15, atol=0
    )
    e0 = (_h(1) + _h(0.5, 0.5) + _h(0.2, 0.3, 0.5)) / 3
    e1 = (_h(1) + _h(0.25, 0.75)) / 2
    assert float(got["attention_entropy"][0, 0]) == pytest.approx((e0 + e1) / 2, rel=1e-15)


def test_top_key_is_not_always_the_first_token():
    probs = torch.tensor([[[[0.1, 0.9], [0.2, 0.8]]]], dtype=F64)
    totals = Totals(1)
    totals.add_heads(1, head_sums(probs, torch.ones(1, 2, dtype=torch.bool)))
    got = totals.attention()
    assert int(got["top_key"][0, 0]) == 1
    assert float(got["top_key_score"][0, 0]) == pytest.approx(0.85, rel=1e-15)
    assert float(got["sink_score"][0, 0]) == pytest.approx(0.15, rel=1e-15)


@settings(max_examples=30, deadline=None)
@given(
    concentration=st.sampled_from([1e-3, 0.05, 1.0, 50.0, 1e6]),
    causal=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_low_precision_run_within_its_stated_bounds(concentration, causal, dtype, seed):
    """Below float64 the logs and the sums over rows are float32 (probe.measures.attention_stats'
    docstring): every term -A log A >= 0 carries at most one float32 rounding of the log and
    one of the product, and a row's sum of n nonnegative terms at most n - 1 roundings, so
    the entropy is within (n + 1) 2^-24 relative of the float64 computation on the same
    values and the received attention within (n - 1) 2^-24 (n = 17 real tokens here, or 12)."""
    rng = np.random.default_rng(seed)
    B, H, T = 3, 2, 17
    probs = np.zeros((B, H, T, T))
    for b in range(B):
        for h in range(H):
            for i in range(T):
                keys = i + 1 if causal else T
                probs[b, h, i, :keys] = rng.dirichlet(np.full(keys, concentration))
    low = torch.from_numpy(probs).to(dtype)
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, 12:] = False  # a padded sequence: its garbage must not count in either
    low[1, :, 12:, :] = 0.5
    low[1, :, :, 12:] = 0.5
    got = head_sums(low, real, spectrum=False)
    want = head_sums(low.to(F64), real, spectrum=False)
    np.testing.assert_allclose(got["entropy"], want["entropy"], rtol=(T + 1) * 2.0**-24, atol=0)
    np.testing.assert_allclose(got["received"], want["received"], rtol=(T - 1) * 2.0**-24, atol=0)
    # A sequence's first-key score decides its sink the same way unless it lies within the
    # received attention's bound of eps.
    first = low.to(F64)[..., 0] * real[:, None, :]  # (B, H, query): the real rows only
    exact = first.sum(-1) / real.sum(1, keepdim=True)  # (B, H)
    if bool(((exact - EPSILON).abs() > (T - 1) * 2.0**-24).all()):
        assert torch.equal(got["sinks"], want["sinks"])


def test_massive_sums_batched_equal_a_loop_over_sequences():
    """The batched sums (sequences grouped by real length) against the plain per-sequence
    loop they replace: equal to the last bit (selections, and the sums in sequence order)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 9, 5, generator=gen, dtype=torch.float32)
    x[2, 4, 1] = x[5, 0, 3] = -30.0  # equal largest |entries|: the first sequence keeps it
    real = torch.ones(7, 9, dtype=torch.bool)
    real[1, 6:] = real[3, :2] = real[4, 6:] = real[6, 1] = False  # lengths 9, 6, 7, 8
    top = median = torch.zeros((), dtype=F64)
    for s in range(7):
        a = x[s].to(F64).abs()[real[s]].flatten()
        top, median = top + a.max(), median + a.median()
    got = massive_sums(x, real)
    assert float(got["top"]) == float(top) and float(got["median"]) == float(median)
    assert float(got["largest"]) == 30.0 and got["where"].tolist() == [2, 4, 1]
    real[2, 4] = False  # now the second one, in sequence 5 at token 0
    assert massive_sums(x, real)["where"].tolist() == [5, 0, 3]


def test_gap_and_stable_rank_of_known_spectra():
    T = 4
    uniform = torch.full((T, T), 1 / T, dtype=F64)  # 1 1^T / T: sigma = (1, 0, 0, 0)
    eye = torch.eye(T, dtype=F64)  # sigma = (1, 1, 1, 1)
    padded = torch.eye(T, dtype=F64)
    padded[3] = 5.0  # a padding row of garbage: the real 3 x 3 block is I_3
    padded[:, 3] = 7.0
    probs = torch.stack([uniform, eye, padded])[:, None]  # (3, 1, T, T)
    real = torch.ones(3, T, dtype=torch.bool)
    real[2, 3] = False
    for s, (gap, stable) in enumerate([(1.0, 1.0), (0.0, 4.0), (0.0, 3.0)]):
        sums = head_sums(probs[s : s + 1], real[s : s + 1])
        # LAPACK's singular values of these matrices: exact to a few ulps.
        assert float(sums["gap"][0]) == pytest.approx(gap, abs=1e-15)
        assert float(sums["stable_rank"][0]) == pytest.approx(stable, rel=1e-14)
    both = head_sums(probs[:2], real[:2])  # summed over sequences
    assert float(both["gap"][0]) == pytest.approx(1.0, abs=1e-15)
    assert float(both["stable_rank"][0]) == pytest.approx(5.0, rel=1e-14)
    assert float(both["count"]) == 2


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 5),
    n=st.integers(1, 60),
    levels=st.sampled_from([3, 1000]),  # 3: many ties
    dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_lower_median_is_the_lower_middle_value(rows, n, levels, dtype, seed):
    """torch's median(1) convention, the ((n - 1) // 2)-th smallest, by sorting."""
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(rng.integers(0, levels, (rows, n)) / 7.0).to(dtype)
    want = np.sort(values.to(F64).numpy(), axis=1)[:, (n - 1) // 2]
    got = lower_median(values)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.to(F64).numpy(), want)


def test_massive_ratio_and_location_by_hand():
    x = torch.tensor(
        [
            [[1.0, -2.0], [3.0, 100.0], [0.5, 0.5]],  # top 100, |entries| 0.5 0.5 1 2 3 100
            [[-50.0, 1.0], [2.0, 4.0], [999.0, 999.0]],  # last token padding: never counted
        ],
        dtype=F64,
    )
    real = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    sums = massive_sums(x, real)
    # torch's median of an even count is the lower middle: (0.5 0.5 1 2 3 100) -> 1;
    # (1 2 4 50) -> 2.
    assert float(sums["top"]) == 150.0 and float(sums["median"]) == 3.0
    assert float(sums["largest"]) == 100.0 and sums["where"].tolist() == [0, 1, 1]
    totals = Totals(0)
    totals.add_hidden(0, x, real, first=10)
    totals.add_hidden(0, -2 * x[1:], real[1:], first=12)  # a later batch: 100 at (12, 0, 0)
    got = totals.hidden()
    assert float(got["massive_ratio"][0]) == (150.0 + 100.0) / (3.0 + 4.0)
    assert (got["massive_sequence"][0], got["massive_token"][0], got["massive_dim"][0]) == (
        10,
        1,
        1,
    )  # 100 was first: a tie keeps the earlier place


def test_anisotropy_is_the_mean_cosine_across_sequences():
    # One token each: the single cross pair's cosine.
    x = torch.tensor([[[1.0, 0.0]], [[3.0, 3.0]]], dtype=F64)
    totals = Totals(0)
    totals.add_hidden(0, x, torch.ones(2, 1, dtype=torch.bool), 0)
    assert float(totals.hidden()["anisotropy"][0]) == pytest.approx(1 / math.sqrt(2), rel=1e-15)
    # Sequence a: e1, e2 (and a padding token); sequence b: 2 e1.  Cross pairs (a1, b) = 1 and
    # (a2, b) = 0: mean 0.5; the within pair (a1, a2) = 0 does not count.
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], [[2.0, 0.0], [0, 0], [0, 0]]])
    real = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    sums = anisotropy_sums(x, real)
    assert float(sums["tokens"]) == 3 and float(sums["pairs_within"]) == 5
    totals = Totals(0)
    totals.add_hidden(0, x, real, 0)
    assert float(totals.hidden()["anisotropy"][0]) == pytest.approx(0.5, rel=1e-15)
    # Batches add up: the same tokens split over two batches give the same number.
    totals = Totals(0)
    totals.add_hidden(0, x[:1], real[:1], 0)
    totals.add_hidden(0, x[1:], real[1:], 1)
    assert float(totals.hidden()["anisotropy"][0]) == pytest.approx(0.5, rel=1e-15)
    one = Totals(0)  # one sequence: no pair across sequences
    one.add_hidden(0, x[:1], real[:1], 0)
    assert math.isnan(float(one.hidden()["anisotropy"][0]))


def test_sink_head_share_counts_strictly_above_epsilon():
    scores = torch.tensor([[0.5, 0.2], [0.31, 0.3]], dtype=F64)
    assert float(sink_head_share(scores)) == 0.5  # 0.3 itself is not above 0.3
    assert float(sink_head_share(scores, 0.1)) == 1.0
    assert float(sink_head_share(scores, 0.9)) == 0.0


def test_sink_rate_thresholds_each_sequence_before_averaging():
    """Gu et al.'s Sink_eps: head 0 gives the first token 0.2 in both sequences, head 1 gives
    it 0.2 and 0.35: one of the four (sequence, head) scores passes 0.3.  Head 1's mean score,
    0.275, does not: thresholding the mean says no sink anywhere."""
    a = torch.tensor([[0.2, 0.8], [0.2, 0.8]], dtype=F64)
    b = torch.tensor([[0.35, 0.65], [0.35, 0.65]], dtype=F64)
    probs = torch.stack([torch.stack([a, a]), torch.stack([a, b])])  # (2, 2, 2, 2)
    real = torch.ones(2, 2, dtype=torch.bool)
    totals = Totals(1)
    totals.add_heads(1, head_sums(probs, real))
    got = totals.attention()
    assert got["sink_frequency"][0].tolist() == [0.0, 0.5]
    assert float(sink_rate(got["sink_frequency"])) == 0.25  # 1 of 4 (sequence, head) pairs
    assert float(got["sink_score"][0, 1]) == pytest.approx(0.275, rel=1e-15)
    assert float(sink_head_share(got["sink_score"])) == 0.0


def test_a_causal_key_is_averaged_over_the_rows_that_can_see_it():
    """Gu et al.'s importance score: key k of a causal T-token sequence is seen by the T - k
    rows i >= k.  Sequence 0 (3 tokens): key 1 gets (0.5 + 0.3) / 2, key 2 gets 0.5 / 1;
    sequence 1 (2 real tokens): key 1 gets 0.75 / 1.  The first key is seen by every row.
    A last row that looks at itself makes the last key the top one, where the mean over all
    rows (0.9 / 3) would leave it below the first (1.55 / 3)."""
    probs, real = _batch()
    sums = head_sums(probs, real, _causal(real))
    r0 = [(1 + 0.5 + 0.2) / 3, (0.5 + 0.3) / 2, 0.5 / 1]
    r1 = [(1 + 0.25) / 2, 0.75 / 1, 0.0]
    want = torch.tensor([a + b for a, b in zip(r0, r1, strict=True)], dtype=F64)
    torch.testing.assert_close(sums["received"][0], want, rtol=1e-15, atol=0)
    assert torch.equal(sums["received"][0, 0], head_sums(probs, real)["received"][0, 0])
    last = torch.tensor([[[[1.0, 0, 0], [0.5, 0.5, 0], [0.05, 0.05, 0.9]]]], dtype=F64)
    everyone = torch.ones(1, 3, dtype=torch.bool)
    for causal, top in ((True, 2), (False, 0)):
        totals = Totals(1)
        totals.add_heads(1, head_sums(last, everyone, _causal(everyone) if causal else None))
        assert int(totals.attention()["top_key"][0, 0]) == top


def _causal(real):
    """(batch, 1, query, key): the real rows i >= k see key k, written out by hand."""
    B, T = real.shape
    seen = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for k in range(i + 1):
                seen[b, 0, i, k] = bool(real[b, i] and real[b, k])
    return seen


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, float("nan"), True, "0.3", None])
def test_epsilon_outside_the_open_interval_is_refused_in_one_line(bad):
    with pytest.raises(ProbeError, match="`epsilon` must be a number strictly between 0 and 1"):
        check_epsilon(bad)
    assert check_epsilon(0.3) == 0.3


# ------------------------------------- the spectrum against numpy's float64 SVD (top_two)
# Both sides are backward-stable SVDs: each singular value within a few T eps sigma_1 of the
# exact one of the matrix as the run holds it (probe.measures.attention_stats' docstring), eps
# the working precision's: float64's for a float64 run, float32's for float32 and bfloat16
# runs (the spectrum is computed in float32 there).  So they agree to 4 T eps sigma_1 in every
# sigma_i, 8 T eps sigma_1 in the gap; the stable rank (||A||_F^2 / sigma_1^2 against numpy's
# sum sigma_i^2 / sigma_1^2) to 8 T eps relative.  numpy's side is the float64 SVD of the same
# rounded entries, so the test measures the computation, not the run's rounding of A.
EPS = float(np.finfo(np.float64).eps)
DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def _held(A: np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray, float]:
    """A as a run of ``dtype`` holds it, those same values in float64 for numpy, and the
    working precision's eps."""
    held = torch.from_numpy(A).to(dtype)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return held, held.to(torch.float64).numpy(), float(torch.finfo(work).eps)


def _rows(logits: np.ndarray, causal: bool = False) -> np.ndarray:
    """Row-wise softmax of (..., T, T) logits; ``causal``: only keys k <= i."""
    if causal:
        T = logits.shape[-1]
        logits = np.where(np.tril(np.ones((T, T), dtype=bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _hard_cases(T: int = 24) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(29)
    noise = rng.standard_normal((3, T, T))
    permutation = np.eye(T)[rng.permutation(T)]
    return {
        "uniform": np.full((1, T, T), 1 / T),  # sigma = (1, 0, ...)
        "near-uniform": _rows(1e-7 * noise),  # sigma_2 ~ 1e-8: absolute accuracy only
        "random-init": _rows(0.3 * noise),  # a flat bulk under sigma_1 ~ 1
        "near-permutation": _rows(30 * permutation + 1e-3 * noise),  # sigma_1 ~ sigma_2 ~ 1
        "permutation": permutation[None],  # every sigma = 1: the gap is 0
        "causal": _rows(np.zeros((1, T, T)), causal=True),  # Cesaro-like: decaying spectrum
        "causal-random": _rows(noise, causal=True),
        "sink": _rows(np.where(np.arange(T) == 0, 8.0, 0.0) + 0.1 * noise),  # sigma_1 ~ sqrt T
        "dirichlet": rng.dirichlet(np.full(T, 0.1), size=(3, T)),
        "rank-two": np.repeat(np.stack([np.eye(T)[0], np.full(T, 1 / T)]), T // 2, 0)[None],
    }


def _numpy_spectrum(A: np.ndarray) -> np.ndarray:
    return np.linalg.svd(A, compute_uv=False)


def _frobenius_rtol(T: int, eps: float) -> float:
    # Each square rounded once to the working precision (eps / 2 relative, every term >= 0),
    # summed in float64 (a sum of squares: ~log2(T^2) eps; 8 T eps as the float64 bound).
    return eps / 2 + 8 * T * EPS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(_hard_cases()))
def test_top_two_against_numpy_svd_on_hard_cases(case, dtype):
    held, A, eps = _held(_hard_cases()[case], dtype)
    T = A.shape[-1]
    sigma_1, sigma_2, frobenius = top_two(held)
    assert sigma_1.dtype == sigma_2.dtype == frobenius.dtype == torch.float64
    for m in range(A.shape[0]):
        want = _numpy_spectrum(A[m])
        tol = 4 * T * eps * want[0]
        assert abs(float(sigma_1[m]) - want[0]) <= tol
        assert abs(float(sigma_2[m]) - want[1]) <= tol
        assert float(frobenius[m]) == pytest.approx((want**2).sum(), rel=_frobenius_rtol(T, eps))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(_hard_cases()))
def test_gap_and_stable_rank_against_numpy_svd_with_padding(case, dtype):
    """The matrices inside a padded batch (garbage in the padding rows and columns), each
    sequence a different real length, summed over sequences as head_sums does."""
    A = _hard_cases(16)[case]
    T = 20
    lengths = [16, 13, 9][: A.shape[0]] if A.shape[0] > 1 else [16]
    probs = np.full((len(lengths), 2, T, T), 7.0)  # head 1: the transpose's rows renormalised
    real = np.zeros((len(lengths), T), dtype=bool)
    for s, n in enumerate(lengths):
        block = A[s % A.shape[0], :n, :n]
        block = block / np.maximum(block.sum(-1, keepdims=True), 1e-300)
        other = block.T / np.maximum(block.T.sum(-1, keepdims=True), 1e-300)
        probs[s, 0, :n, :n], probs[s, 1, :n, :n] = block, other
        real[s, :n] = True
    held, probs, eps = _held(probs, dtype)
    gap, stable = np.zeros(2), np.zeros(2)
    for s, n in enumerate(lengths):
        for h in range(2):
            sigma = _numpy_spectrum(probs[s, h, :n, :n])
            gap[h] += sigma[0] - sigma[1]
            stable[h] += (sigma**2).sum() / sigma[0] ** 2
    sums = head_sums(held, torch.from_numpy(real))
    count = len(lengths)
    # Per sequence: gap within 8 T eps sigma_1, sigma_1 <= sqrt(T) for row-stochastic A.
    np.testing.assert_allclose(sums["gap"].numpy(), gap, rtol=0, atol=count * 8 * T**1.5 * eps)
    np.testing.assert_allclose(sums["stable_rank"].numpy(), stable, rtol=8 * T * eps, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 40),
    concentration=st.sampled_from([1e-3, 0.05, 1.0, 50.0, 1e6]),
    causal=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**32 - 1),
)
def test_top_two_property_against_numpy(T, concentration, causal, dtype, seed):
    """Random Dirichlet attention rows (from one-hot to uniform), causal or not, held in each
    dtype: sigma_1 and sigma_2 within 4 T eps sigma_1 of numpy's SVD, the stable rank within
    8 T eps, eps the working precision's."""
    rng = np.random.default_rng(seed)
    A = np.zeros((2, T, T))
    for m in range(2):
        for i in range(T):
            keys = i + 1 if causal else T  # a causal row i sees keys 0..i
            A[m, i, :keys] = rng.dirichlet(np.full(keys, concentration))
    held, A, eps = _held(A, dtype)
    sigma_1, sigma_2, frobenius = top_two(held)
    for m in range(2):
        want = _numpy_spectrum(A[m])
        second = want[1] if T > 1 else 0.0
        tol = 4 * T * eps * want[0]
        assert abs(float(sigma_1[m]) - want[0]) <= tol
        assert abs(float(sigma_2[m]) - second) <= tol
        assert float(frobenius[m] / sigma_1[m] ** 2) == pytest.approx(
            (want**2).sum() / want[0] ** 2, rel=8 * T * eps
        )
