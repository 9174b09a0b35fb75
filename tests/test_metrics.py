"""Tests for probe.measures.metrics: hand-computed values, a NumPy oracle, properties, errors.

The accuracy of the linear algebra under the metrics is pinned in tests/test_linalg.py."""

from __future__ import annotations

import math
import re

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from probe.linalg import top
from probe.measures import metrics
from tests.batches import (
    as_tensor,
    assert_close,
    assert_metrics_close,
    gaussian_batches,
    integer_batches,
    random_batch,
    scaled,
    torch_metrics,
)
from tests.reference import metrics_numpy as ref

PROPERTY = settings(max_examples=50, deadline=None)
SCALAR_METRICS = ("effective_rank", "stable_rank", "cosine_similarity")
# With ties s_1 = s_2 the rank-one fit is not unique; only these svd-fit norms stay defined.
TIE_SAFE_NORMS = ("fro", "spectral")


# --------------------------------------------------------------------------- hand-computed


def test_matrix_norm_by_hand():
    # A = [[1, -2], [3, 4]]
    # column abs sums 4, 6 -> l1 = 6;  row abs sums 3, 7 -> linf = 7;  l1inf = sqrt(42)
    # fro = sqrt(1 + 4 + 9 + 16) = sqrt(30)
    # A^T A = [[10, 10], [10, 20]], eigenvalues 15 +- 5 sqrt(5) -> spectral = sqrt(15 + 5 sqrt 5)
    A = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    expected = {
        "l1": 6.0,
        "linf": 7.0,
        "l1inf": math.sqrt(42.0),
        "fro": math.sqrt(30.0),
        "spectral": math.sqrt(15 + 5 * math.sqrt(5)),
    }
    for norm, value in expected.items():
        out = metrics.matrix_norm(A, norm)
        assert out.dtype == torch.float64 and out.shape == ()
        assert out.item() == pytest.approx(value, rel=1e-14)
    # batched: leading dimensions are kept
    batch = torch.stack([A, 2 * A, -A])[None]  # (1, 3, 2, 2)
    assert_close(metrics.matrix_norm(batch, "l1inf"), [[math.sqrt(42) * c for c in (1, 2, 1)]])


# X = [[1, 0], [0, 1], [2, 2]] (a junk row is inserted and masked out below)
#   mean x = (1, 1);  mean residual R = [[0, -1], [-1, 0], [1, 1]]
#   ||R||: l1 = 2 (columns 2, 2), linf = 2 (rows 1, 1, 2), l1inf = 2, fro = 2,
#          R^T R = [[2, 1], [1, 2]] -> spectral = sqrt(3)
#   ||X||: l1 = 3 (columns 3, 3), linf = 4 (rows 1, 1, 4), l1inf = sqrt(12), fro = sqrt(10),
#          X^T X = [[5, 4], [4, 5]] -> singular values 3, 1, spectral = 3, v_1 = (1, 1)/sqrt 2
#   svd fit: rows projected on v_1 are (.5, .5), (.5, .5), (2, 2), so the residual is
#          [[.5, -.5], [-.5, .5], [0, 0]]: l1 = 1, linf = 1, l1inf = 1, fro = 1, spectral = s_2 = 1
#   effective rank: p = (3/4, 1/4), exp(H) = (3/4)^(-3/4) (1/4)^(-1/4) = 4 / 3^(3/4)
#   stable rank: (9 + 1) / 9 = 10/9
#   cosine: cos(x1, x2) = 0, cos(x1, x3) = cos(x2, x3) = 2 / sqrt(8) = 1/sqrt 2 -> mean sqrt(2)/3
HAND_X = [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]
HAND_RELATIVE = {
    "mean": {
        "l1inf": 2 / math.sqrt(12),
        "fro": 2 / math.sqrt(10),
        "spectral": math.sqrt(3) / 3,
        "l1": 2 / 3,
        "linf": 2 / 4,
    },
    "svd": {
        "l1inf": 1 / math.sqrt(12),
        "fro": 1 / math.sqrt(10),
        "spectral": 1 / 3,
        "l1": 1 / 3,
        "linf": 1 / 4,
    },
}
HAND_RESIDUAL = {
    "mean": [[0.0, -1.0], [-1.0, 0.0], [1.0, 1.0]],
    "svd": [[0.5, -0.5], [-0.5, 0.5], [0.0, 0.0]],
}


@pytest.mark.parametrize("padded", [False, True])
def test_hand_example(padded):
    if padded:  # junk row at position 1, masked out
        X = torch.tensor([[HAND_X[0], [99.0, math.nan], HAND_X[1], HAND_X[2]]])
        mask = torch.tensor([[True, False, True, True]])
        real = [0, 2, 3]
    else:
        X, mask, real = torch.tensor([HAND_X]), None, [0, 1, 2]
    for fit in metrics.FITS:
        res = metrics.residual(X, mask, fit=fit)
        assert_close(res[0, real], HAND_RESIDUAL[fit], atol=1e-14)
        if padded:
            assert torch.equal(res[0, 1], torch.zeros(2, dtype=torch.float64))
        for norm in metrics.NORMS:
            out = metrics.relative_residual(X, mask, norm=norm, fit=fit)
            assert out.item() == pytest.approx(HAND_RELATIVE[fit][norm], rel=1e-13)
    assert metrics.effective_rank(X, mask).item() == pytest.approx(4 / 3**0.75, rel=1e-13)
    assert metrics.stable_rank(X, mask).item() == pytest.approx(10 / 9, rel=1e-13)
    assert metrics.cosine_similarity(X, mask).item() == pytest.approx(math.sqrt(2) / 3, rel=1e-13)

    out = metrics.collapse_metrics(X, mask)
    expected = [[HAND_RELATIVE[fit][norm] for norm in metrics.NORMS] for fit in metrics.FITS]
    assert_close(out["relative_residual"][0], expected, rtol=1e-13)
    assert out["effective_rank"].item() == pytest.approx(4 / 3**0.75, rel=1e-13)
    assert out["mu"].item() == pytest.approx(2.0, rel=1e-14)  # ||R||_F = 2 (above)


def test_cosine_zero_norm_token_counts_as_zero():
    # tokens 0, (1, 0), (1, 0): pairs (0,1) and (0,2) count 0, pair (1,2) counts 1 -> 1/3
    X = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.0, 0.0]]])
    assert metrics.cosine_similarity(X).item() == pytest.approx(1 / 3, rel=1e-14)


def test_opposite_tokens_have_cosine_minus_one():
    X = torch.tensor([[[1.0, 2.0], [-1.0, -2.0]]])
    assert metrics.cosine_similarity(X).item() == pytest.approx(-1.0, rel=1e-14)


def test_all_zero_sequence_conventions():
    X = torch.zeros(2, 4, 3)
    X[1] = torch.arange(12.0).reshape(4, 3)
    out = metrics.collapse_metrics(X)
    assert torch.isnan(out["relative_residual"][0]).all()
    assert torch.isnan(out["effective_rank"][0]) and torch.isnan(out["stable_rank"][0])
    assert out["cosine_similarity"][0] == 0
    # the other sequence is unaffected
    assert torch.isfinite(out["relative_residual"][1]).all()
    for fit in metrics.FITS:
        for norm in metrics.NORMS:
            assert torch.isnan(metrics.relative_residual(X, norm=norm, fit=fit)[0])
    assert torch.isnan(metrics.effective_rank(X)[0]) and torch.isnan(metrics.stable_rank(X)[0])
    assert torch.equal(metrics.residual(X, fit="svd")[0], torch.zeros(4, 3, dtype=torch.float64))


def test_identical_tokens_are_fully_collapsed():
    X = torch.tensor([[0.3, -1.2, 2.5]]).repeat(5, 1)[None]  # (1, 5, 3)
    out = metrics.collapse_metrics(X)
    assert out["relative_residual"].abs().max() < 1e-14
    assert out["effective_rank"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["stable_rank"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["cosine_similarity"].item() == pytest.approx(1.0, abs=1e-14)


def test_extreme_scales_do_not_under_or_overflow():
    X, mask = random_batch(np.random.default_rng(7), 3, 6, 5)
    expected = torch_metrics(X, mask)
    for scale in (1e-300, 1e-200, 1e200, 1e300):
        assert_metrics_close(torch_metrics(X * scale, mask), scaled(expected, scale), rtol=1e-9)


# ------------------------------------------------------------------------- NumPy oracle

ORACLE_SHAPES = [(3, 5, 4), (2, 7, 12), (4, 16, 3), (1, 2, 1), (3, 9, 9), (2, 3, 40)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", ORACLE_SHAPES)
def test_matches_numpy_reference(shape, seed):
    X, mask = random_batch(np.random.default_rng(seed), *shape)
    Xt, mt = as_tensor(X), torch.as_tensor(mask)
    for fit in metrics.FITS:
        assert_close(metrics.residual(Xt, mt, fit=fit), ref.residual(X, mask, fit))
        for norm in metrics.NORMS:
            assert_close(
                metrics.relative_residual(Xt, mt, norm=norm, fit=fit),
                ref.relative_residual(X, mask, norm, fit),
            )
    assert_close(metrics.effective_rank(Xt, mt), ref.effective_rank(X, mask))
    assert_close(metrics.stable_rank(Xt, mt), ref.stable_rank(X, mask))
    assert_close(metrics.cosine_similarity(Xt, mt), ref.cosine_similarity(X, mask))
    assert_metrics_close(metrics.collapse_metrics(Xt, mt), ref.collapse_metrics(X, mask))
    # without a mask (junk replaced by real values)
    X = np.nan_to_num(X, nan=0.5)
    assert_metrics_close(metrics.collapse_metrics(as_tensor(X)), ref.collapse_metrics(X))


@pytest.mark.parametrize("norm", metrics.NORMS)
def test_matrix_norm_matches_numpy(norm):
    A = np.random.default_rng(1).standard_normal((2, 3, 6, 4))  # batch of 2 x 3 matrices
    expected = [[ref.matrix_norm(A[i, j], norm) for j in range(3)] for i in range(2)]
    assert_close(metrics.matrix_norm(as_tensor(A), norm), expected)
    transposed = [[ref.matrix_norm(A[i, j].T, norm) for j in range(3)] for i in range(2)]
    assert_close(metrics.matrix_norm(as_tensor(A).mT, norm), transposed)


@PROPERTY
@given(integer_batches())
def test_matches_numpy_reference_on_degenerate_inputs(batch):
    X, mask = batch
    actual, expected = torch_metrics(X, mask), ref.collapse_metrics(X, mask)
    for key in SCALAR_METRICS:
        assert_close(actual[key], expected[key], atol=1e-10)
    mean, svd = metrics.FITS.index("mean"), metrics.FITS.index("svd")
    assert_close(actual["relative_residual"][:, mean], expected["relative_residual"][:, mean])
    for norm in TIE_SAFE_NORMS:
        k = metrics.NORMS.index(norm)
        assert_close(
            actual["relative_residual"][:, svd, k],
            expected["relative_residual"][:, svd, k],
            atol=1e-10,
        )


@pytest.mark.parametrize("seed", range(3))
def test_collapse_metrics_matches_individual_functions(seed):
    X, mask = random_batch(np.random.default_rng(seed), 4, 10, 6)
    Xt, mt = as_tensor(X), torch.as_tensor(mask)
    out = metrics.collapse_metrics(Xt, mt)
    for f, fit in enumerate(metrics.FITS):
        for k, norm in enumerate(metrics.NORMS):
            single = metrics.relative_residual(Xt, mt, norm=norm, fit=fit)
            assert_close(out["relative_residual"][:, f, k], single, rtol=1e-12)
    assert_close(out["effective_rank"], metrics.effective_rank(Xt, mt), rtol=1e-12)
    assert_close(out["stable_rank"], metrics.stable_rank(Xt, mt), rtol=1e-12)
    assert_close(out["cosine_similarity"], metrics.cosine_similarity(Xt, mt), rtol=1e-12)


# --------------------------------------------------------------------------- properties

small_values = st.integers(-20, 20).map(lambda k: k / 4)


@PROPERTY
@given(
    x=hnp.arrays(np.float64, st.integers(1, 6), elements=small_values),
    n=st.integers(2, 7),
    data=st.data(),
)
def test_constant_tokens_have_zero_mean_residual(x, n, data):
    assume(np.any(x != 0))
    T = n + data.draw(st.integers(0, 3))
    real = sorted(data.draw(st.sets(st.integers(0, T - 1), min_size=n, max_size=n)))
    X = np.full((1, T, x.size), np.nan)
    X[0, real] = x  # X = 1 x^T on the real tokens
    mask = np.zeros((1, T), dtype=bool)
    mask[0, real] = True
    out = torch_metrics(X, mask)
    assert out["relative_residual"].abs().max() < 1e-12  # mean fit and svd fit
    assert out["cosine_similarity"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["effective_rank"].item() == pytest.approx(1.0, abs=1e-12)
    assert out["stable_rank"].item() == pytest.approx(1.0, abs=1e-12)


@PROPERTY
@given(
    u=hnp.arrays(np.float64, st.integers(2, 7), elements=small_values),
    v=hnp.arrays(np.float64, st.integers(1, 6), elements=small_values),
)
def test_rank_one_has_zero_svd_residual(u, v):
    assume(np.any(u != 0) and np.any(v != 0))
    X = torch.as_tensor(np.outer(u, v))[None]  # (1, token, hidden)
    svd = metrics.FITS.index("svd")
    assert metrics.collapse_metrics(X)["relative_residual"][0, svd].abs().max() < 1e-12
    for norm in metrics.NORMS:
        assert metrics.relative_residual(X, norm=norm, fit="svd").item() < 1e-12
    assert metrics.residual(X, fit="svd").abs().max() < 1e-12 * np.abs(X.numpy()).max()
    assert metrics.effective_rank(X).item() == pytest.approx(1.0, abs=1e-12)
    assert metrics.stable_rank(X).item() == pytest.approx(1.0, abs=1e-12)


@PROPERTY
@given(
    batch=gaussian_batches(),
    c=st.floats(1e-3, 1e3) | st.sampled_from([2.0**-40, 2.0**40]),
    sign=st.sampled_from([1.0, -1.0]),
)
def test_scale_invariance(batch, c, sign):
    X, mask = batch
    expected = scaled(torch_metrics(X, mask), c)
    assert_metrics_close(torch_metrics(sign * c * X, mask), expected, rtol=1e-9)


@PROPERTY
@given(batch=gaussian_batches(), data=st.data())
def test_token_permutation_invariance(batch, data):
    X, mask = batch
    perm = data.draw(st.permutations(range(X.shape[1])))
    expected = torch_metrics(X, mask)
    assert_metrics_close(torch_metrics(X[:, perm], mask[:, perm]), expected, rtol=1e-9)
    # the residual permutes with the tokens
    for fit in metrics.FITS:
        res = metrics.residual(as_tensor(X), torch.as_tensor(mask), fit=fit)
        res_perm = metrics.residual(as_tensor(X[:, perm]), torch.as_tensor(mask[:, perm]), fit=fit)
        assert_close(res_perm, res[:, perm], rtol=1e-8, atol=1e-10)


@PROPERTY
@given(
    lengths=st.lists(st.integers(2, 6), min_size=1, max_size=4),
    H=st.integers(1, 7),
    extra=st.integers(0, 4),
    seed=st.integers(0, 2**32 - 1),
    junk=st.sampled_from([math.nan, math.inf, -1e300, 7.0]),
    data=st.data(),
)
def test_padded_batch_equals_unpadded_parts(lengths, H, extra, seed, junk, data):
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal((n, H)) + rng.standard_normal(H) for n in lengths]
    T = max(lengths) + extra
    X = np.full((len(parts), T, H), junk)
    mask = np.zeros((len(parts), T), dtype=bool)
    for s, part in enumerate(parts):
        n = len(part)
        real = sorted(data.draw(st.sets(st.integers(0, T - 1), min_size=n, max_size=n)))
        X[s, real], mask[s, real] = part, True
    padded = torch_metrics(X, mask)
    for s, part in enumerate(parts):
        alone = metrics.collapse_metrics(as_tensor(part[None]))
        for key in alone:
            assert_close(padded[key][s], alone[key][0], rtol=1e-12, atol=1e-13)
    for fit in metrics.FITS:
        res = metrics.residual(as_tensor(X), torch.as_tensor(mask), fit=fit)
        assert torch.equal(res[torch.as_tensor(~mask)], torch.zeros((~mask).sum(), H).double())
        for s, part in enumerate(parts):
            alone = metrics.residual(as_tensor(part[None]), fit=fit)[0]
            assert_close(res[s][torch.as_tensor(mask[s])], alone, rtol=1e-10, atol=1e-12)


@PROPERTY
@given(
    k=st.integers(2, 6),
    extra_hidden=st.integers(0, 4),
    zero_tokens=st.integers(0, 2),
    scale=st.floats(1e-2, 1e2),
    seed=st.integers(0, 2**32 - 1),
)
def test_orthogonal_equal_norm_tokens(k, extra_hidden, zero_tokens, scale, seed):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((k + extra_hidden, k)))  # orthonormal columns
    X = np.vstack([scale * q.T, np.zeros((zero_tokens, k + extra_hidden))])[None]
    out = metrics.collapse_metrics(as_tensor(X))
    assert out["effective_rank"].item() == pytest.approx(k, rel=1e-10)
    assert out["stable_rank"].item() == pytest.approx(k, rel=1e-10)
    assert out["cosine_similarity"].item() == pytest.approx(0.0, abs=1e-12)


@PROPERTY
@given(integer_batches())
def test_bounds(batch):
    X, mask = batch
    out = {key: value.numpy() for key, value in torch_metrics(X, mask).items()}
    rel = out["relative_residual"]
    mean, svd = metrics.FITS.index("mean"), metrics.FITS.index("svd")
    for s in range(len(X)):
        real = X[s][mask[s]]
        if not real.any():
            assert np.isnan(rel[s]).all()
            assert np.isnan(out["effective_rank"][s]) and np.isnan(out["stable_rank"][s])
            assert out["cosine_similarity"][s] == 0
            continue
        rank = np.linalg.matrix_rank(real)
        erank, srank = out["effective_rank"][s], out["stable_rank"][s]
        # 1 <= stable rank <= effective rank <= rank
        assert 1 - 1e-12 <= srank <= erank + 1e-12
        assert erank <= rank + 1e-9
        assert -1 <= out["cosine_similarity"][s] <= 1
        assert (rel[s] >= 0).all()
        for norm in TIE_SAFE_NORMS:
            k = metrics.NORMS.index(norm)
            # both fits are orthogonal projections, and the svd fit is the best rank-one fit
            assert rel[s, mean, k] <= 1 + 1e-12
            assert rel[s, svd, k] <= rel[s, mean, k] + 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_low_precision_input_gives_float64_output(dtype):
    X, mask = random_batch(np.random.default_rng(3), 2, 5, 4)
    X = torch.as_tensor(np.nan_to_num(X)).to(dtype)
    mask = torch.as_tensor(mask)
    expected = metrics.collapse_metrics(X.double(), mask)
    out = metrics.collapse_metrics(X, mask)
    for key in out:
        assert out[key].dtype == torch.float64 and out[key].device == X.device
        assert torch.equal(out[key], expected[key])  # cast first, then identical computation
    singles = [
        metrics.residual(X, mask),
        metrics.relative_residual(X, mask),
        metrics.effective_rank(X, mask),
        metrics.stable_rank(X, mask),
        metrics.cosine_similarity(X, mask),
        metrics.matrix_norm(X, "spectral"),
    ]
    for out in singles:
        assert out.dtype == torch.float64 and out.device == X.device


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    X, mask = random_batch(np.random.default_rng(5), 4, 12, 20)
    out = metrics.collapse_metrics(as_tensor(X).cuda(), torch.as_tensor(mask))
    for key in out:
        assert out[key].device.type == "cuda" and out[key].dtype == torch.float64
    assert_metrics_close(out, torch_metrics(X, mask), rtol=1e-9)


# ------------------------------------------------------------------------------- errors

ERROR_CASES = [
    (lambda: metrics.collapse_metrics(torch.ones(3, 2)), "X must be a 3-D tensor"),
    (lambda: metrics.effective_rank(torch.ones(1, 2, 3, 4)), "X must be a 3-D tensor"),
    (lambda: metrics.stable_rank(torch.ones(2, 3, 0)), "X must have at least one hidden feature"),
    (
        lambda: metrics.cosine_similarity(torch.ones(2, 3, 4), torch.ones(2, 4, dtype=torch.bool)),
        "mask must have shape (sequence, token) = (2, 3), got (2, 4)",
    ),
    (
        lambda: metrics.relative_residual(torch.ones(2, 3, 4), torch.ones(2, 3)),
        "mask must be a bool tensor",
    ),
    (
        lambda: metrics.collapse_metrics(
            torch.ones(3, 3, 4), torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0]]).bool()
        ),
        "every sequence needs at least 2 real tokens; sequence 1 has 1, sequence 2 has 0",
    ),
    (lambda: metrics.residual(torch.ones(2, 1, 4)), "at least 2 real tokens; sequence 0 has 1"),
    (
        lambda: metrics.relative_residual(torch.ones(1, 3, 2), norm="l2"),
        "unknown norm 'l2'; valid norms: l1inf, fro, spectral, l1, linf",
    ),
    (lambda: metrics.matrix_norm(torch.ones(3, 2), "nuc"), "unknown norm 'nuc'; valid norms:"),
    (lambda: metrics.matrix_norm(torch.ones(3), "fro"), "A must have at least 2 dimensions"),
    (lambda: metrics.matrix_norm(torch.ones(0, 3), "l1"), "A must have at least one row"),
    (
        lambda: metrics.relative_residual(torch.ones(1, 3, 2), fit="pca"),
        "unknown fit 'pca'; valid fits: mean, svd",
    ),
    (lambda: metrics.residual(torch.ones(1, 3, 2), fit="median"), "unknown fit 'median'"),
    (
        lambda: metrics.collapse_metrics(torch.tensor([[[1.0], [math.nan]]])),
        "X has non-finite values (NaN or inf) in real (unmasked) tokens",
    ),
    (
        lambda: metrics.collapse_metrics(torch.ones(1, 2, 2, dtype=torch.complex128)),
        "X must be real",
    ),
]


@pytest.mark.parametrize(("call", "message"), ERROR_CASES)
def test_errors(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_padding_may_hold_non_finite_values():
    X = torch.tensor([[[1.0, 0.0], [math.inf, math.nan], [0.0, 1.0]]])
    mask = torch.tensor([[True, False, True]])
    out = metrics.collapse_metrics(X, mask)
    assert all(torch.isfinite(v).all() for v in out.values())


# ------------------------------------------------------- what is computed, and how it is asked


@pytest.mark.parametrize(
    ("chosen", "given"),
    [
        (("cosine_similarity",), ["cosine_similarity"]),
        (("stable_rank",), ["stable_rank"]),
        # mu is the relative residual's numerator: it comes with it
        (("effective_rank", "relative_residual"), ["relative_residual", "mu", "effective_rank"]),
    ],
)
def test_only_the_metrics_asked_for(chosen, given):
    X, mask = random_batch(np.random.default_rng(2), 3, 9, 12)
    Xt, mt = as_tensor(X), torch.as_tensor(mask)
    full = metrics.collapse_metrics(Xt, mt)
    some = metrics.collapse_metrics(Xt, mt, metrics=chosen)
    assert list(some) == given
    for key in some:  # a subset computes the same quantities, in a different amount of work
        assert_close(some[key], full[key], rtol=1e-13, atol=1e-15)
    assert list(metrics.collapse_metrics(Xt, mt, metrics="stable_rank")) == ["stable_rank"]


def test_unknown_metric_name():
    with pytest.raises(ValueError, match=re.escape("unknown metric 'rank'; valid metrics:")):
        metrics.collapse_metrics(torch.ones(1, 3, 2), metrics=["rank"])
    with pytest.raises(ValueError, match="at least one of"):
        metrics.collapse_metrics(torch.ones(1, 3, 2), metrics=[])


def test_input_is_not_modified():
    X, mask = random_batch(np.random.default_rng(9), 3, 10, 12)
    for dtype in (torch.float64, torch.float32):
        Xt = as_tensor(X).to(dtype)
        before = Xt.clone()
        metrics.collapse_metrics(Xt, torch.as_tensor(mask))
        metrics.residual(Xt, torch.as_tensor(mask), fit="svd")
        assert torch.equal(Xt.isnan(), before.isnan())
        assert torch.equal(Xt.nan_to_num(), before.nan_to_num())


def test_effective_rank_method_resolution():
    auto = metrics.effective_rank_method
    assert auto("auto", 128, 768, "cpu") == "exact"
    assert auto("auto", metrics.EXACT_UP_TO, 768, "cpu") == "exact"
    assert auto("auto", metrics.EXACT_UP_TO + 1, 768, "cpu") == "estimate"
    assert auto("auto", 4096, 64, "cpu") == "exact"  # k = min(tokens, hidden)
    assert auto("auto", metrics.EXACT_UP_TO_GPU, 768, "cuda") == "exact"
    assert auto("auto", metrics.EXACT_UP_TO_GPU + 1, 768, "cuda") == "estimate"
    assert metrics.EXACT_UP_TO_GPU == 128  # measured on an H100 (probe.linalg.top)
    # The two choices were measured together: the exact effective rank where the top of the
    # spectrum comes from dense eigensolves, on each device.
    for device in ("cpu", "cuda"):
        exact_up_to = metrics.EXACT_UP_TO if device == "cpu" else metrics.EXACT_UP_TO_GPU
        assert top.dense_up_to(torch.device(device)) == exact_up_to
    assert auto("exact", 2048, 2048, "cuda") == "exact"
    # up to ESTIMATE_FROM the estimate has no room for its probes: exact (it was garbage)
    assert auto("estimate", 8, 8, "cpu") == "exact"
    assert auto("estimate", 80, 80, "cpu") == "estimate"
    with pytest.raises(ValueError, match="unknown effective rank method 'svd'"):
        auto("svd", 8, 8, "cpu")


def test_the_estimate_is_exact_where_it_has_no_room_for_its_probes():
    # Up to ESTIMATE_FROM dimensions the deflation's Krylov vectors span the space and the
    # quadrature has nothing to sample (it was off by up to 130% at k <= 32): every method
    # gives the exact effective rank there, a whole call at small k or one short sequence.
    assert metrics.ESTIMATE_FROM == 48
    auto = metrics.effective_rank_method
    assert auto("estimate", 16, 32, "cpu") == "exact" and auto("auto", 48, 768, "cuda") == "exact"
    assert (
        auto("auto", 129, 768, "cuda") == "estimate"
        and auto("estimate", 65, 768, "cpu") == "estimate"
    )
    generator = torch.Generator().manual_seed(11)
    X = torch.randn(4, 96, 128, generator=generator, dtype=torch.float64)
    X[1] = X[1, :1] + 0.3 * X[1]  # partly collapsed
    mask = torch.ones(4, 96, dtype=torch.bool)
    mask[2, 40:] = False  # 40 real tokens: no room for the probes
    mask[3, 48:] = False  # 48: none either
    names = ("effective_rank",)
    estimate = metrics.collapse_metrics(X, mask, names, "estimate")["effective_rank"]
    exact = metrics.collapse_metrics(X, mask, names, "exact")["effective_rank"]
    # the short sequences: computed exactly, the same arithmetic on fewer rows
    torch.testing.assert_close(estimate[2:], exact[2:], rtol=1e-12, atol=0)
    # the others: the estimate, within its stated 2%, and not exact
    assert ((estimate[:2] - exact[:2]).abs() / exact[:2]).max() < 0.02
    assert not torch.equal(estimate[:2], exact[:2])
    for tokens in (16, 32, 48):  # whole calls at small k
        Y = X[:, :tokens]
        got = metrics.collapse_metrics(Y, None, names, "estimate")["effective_rank"]
        want = metrics.collapse_metrics(Y, None, names, "exact")["effective_rank"]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
