"""What trained transformers do instead of collapsing: the attention and activation statistics.

Pure tensor functions on real (unpadded) tokens only, each as accurate as the arithmetic that
made its inputs (the accuracy per dtype is stated with each statistic below): a float64 run's
statistics are computed in float64 (or are exact selections); a float32, bfloat16 or float16
run's sums over rows and logs in float32, its spectrum to float32's accuracy, and the rest in
float64.
Each takes one batch and returns *sums over its sequences* (and the counts to divide them
by), so a run adds batches up and divides once (:class:`Totals`); only per-(layer, head)
numbers and a few vectors of the hidden size ever leave a layer.

Attention statistics of one layer's probabilities A (sequence s, head h, query i, key k),
rows and columns restricted to the sequence's real tokens (a padding row is dropped; a
padding key receives nothing), each averaged over the real query rows of a sequence, then
over sequences:

* received attention r_hk = mean_s mean_i A_sh[i, k], the mean over the real rows i the run's
  mask let see key k (:func:`probe.surgery.masks.seen`: what the layer's attention received,
  sliding windows included, or the run's own mask): every real row under a bidirectional
  mask, the rows i >= k under a causal one (Gu et al. 2025: sum_i A[i, k] / (T - k)), the
  rows within W of k under a window.  ``sink_score`` is r_h0, the first token's (Gu et al.
  2025; Xiao et al. 2023);
  ``top_key`` the argmax over k of r_hk and ``top_key_score`` its value (Clark et al. 2019:
  BERT's [CLS] and [SEP]).  Each column's sum over its rows is formed in the working precision
  (float64 for a float64 run; float32 for float32, bfloat16 and float16), the rest in
  float64: a sum of n_s nonnegative terms, within (n_s - 1) 2^-24 relative of the float64
  sum of the same probabilities in any summation order (float32's vectorised sums come out
  within a few 2^-24), against the 2^-24 relative that float32's rounding of each entry
  already carries.
* ``sink_frequency``: per (layer, head), the share of sequences whose own first-key score
  (the mean of A_sh[i, 0] over the rows that saw key 0) exceeds eps; its mean over layers and heads is Gu et al.'s sink rate
  Sink_eps (sail-sg/Attention-Sink, ``compute_attention_sink``: each sample thresholded,
  then the indicator averaged over samples, layers and heads).  ``sink_head_share``
  thresholds the mean over sequences instead: the share of (layer, head) pairs whose
  ``sink_score`` exceeds eps, a different number (the pretrained MiniLM: 0.417 against
  Sink_eps's 0.391).
* ``attention_entropy``: mean_s mean_i -sum_k A_ik log A_ik, in nats (0 log 0 = 0, so the
  keys a row cannot see add nothing).  Each row's -sum_k A log A is formed in the working
  precision (float64 for a float64 run; float32 for float32, bfloat16 and float16), the mean
  over rows and sequences in float64.  Every term -A log A is >= 0, so no cancellation: a
  float32 run's entropy is within (n_s + 1) 2^-24 relative of the float64 computation on the
  same probabilities (one rounding of the log and one of the product per term, at most
  n_s - 1 of the sum in any order), the order of what float32's own rounding of them (2^-24
  each) moves it; at a third of the float64 path's cost (a double's log is dear).
* Where the softmax has learned sink logits (GPT-OSS: one more logit per head in each row,
  standing for no key, so a row sums to s_i = sum_k A_ik < 1): ``learned_sink_share``, the
  mean over real rows of 1 - s_i (formed in float64 from the row sums above), the share of
  each row that goes to the learned sink, beside ``sink_score``, the first token's; and the
  entropy counts the learned sink as one more outcome of the row, -sum_k A_ik log A_ik -
  (1 - s_i) log(1 - s_i).  The received attention, the sink score and the top key are the
  keys' probabilities as the model uses them (not renormalised), and the spectrum is that of
  the same matrix.  A family without learned sinks has neither term (its rows sum to one).
* ``attention_gap`` sigma_1 - sigma_2 and ``attention_stable_rank`` sum_i sigma_i^2 /
  sigma_1^2 of each sequence's n_s x n_s matrix A_sh (Nait Saada et al. 2025), mean over
  sequences.  Only three numbers of each matrix are needed (``top_two``): sum_i sigma_i^2 =
  ||A||_F^2, exactly, from the entries (a sum of squares: relative error ~log2(T^2) eps), and
  sigma_1, sigma_2.  The padding rows and columns are zero, which adds only zero singular
  values, so the whole layer's (sequence x head) T x T matrices go at once.  The spectrum is
  computed to the run's working precision (``working_dtype``): float64 for a float64 run,
  float32 for the others.  Below ``KRYLOV_FROM`` = 512 tokens sigma_1 and sigma_2 come from
  LAPACK, on a CPU through ``probe.linalg.lapack``: one serial LAPACK call per matrix, the
  batch split over the threads, each thread making its own piece's copy (a bert-base layer
  at 32 x 128 on 2 loaded cores: 2.2 s against 53 s for torch's per-sequence calls, whose
  MKL threading of each small matrix collapses under load); from CUDA the same, on the host
  (cuSOLVER solves matrices over 32 x 32 one at a time: slower still).  A float64 run takes
  the singular values (gesdd without vectors); a float32 one the two largest eigenvalues
  lambda_i of the Gram matrix A A^T formed in float64 (syevd), sigma_i = sqrt(lambda_i): the
  float32 entries' products are exact in float64, and the Gram matrix and its
  eigensolve cost about 0.75 of a float32 SVD at 128 tokens, 0.85 at 480 (measured on the
  project's 2-core machine).  Either way LAPACK computes all T values, O(T^3) per matrix, and
  this is most of the analysis' cost on a CPU: a Krylov method for the top two is no
  cheaper at T = 128 for a random-init model, whose bulk under sigma_1 is flat (sigma_3 /
  sigma_2 ~ 0.97 for softmax(0.3 z) rows: a block Krylov space of 96 of the 128 dimensions
  still left sigma_2 5e-7 sigma_1 off, 20 dimensions 2e-3).
  Accuracy, of the exact singular values of the probabilities as the run holds them:
  - float64: LAPACK's SVD is backward stable, every singular value within a few T eps
    sigma_1 (eps = 2^-52): sigma_1 relative ~T eps, sigma_2 absolute ~T eps sigma_1
    (relative <= 1e-9 where sigma_2 > 1e-3 sigma_1, T <= 1024), the gap absolute ~2 T eps
    sigma_1, the stable rank relative ~2 T eps: 14 digits of the float64 probabilities.
  - float32 (and bfloat16, float16): the Gram matrix is off by at most T 2^-53 ||A||_F^2
    (sums of T nonnegative terms), its eigensolve adds a few T 2^-53 lambda_1, so
    |lambda_i - sigma_i^2| <= delta ~ T^1.5 2^-53 sigma_1^2 and |sqrt(lambda_i) - sigma_i|
    <= min(delta / sigma_i, sqrt(delta)): at most ~1e-6 sigma_1 at T = 511 for a sigma_2
    near 0, far less where sigma_2 is not small.  The stated bound is that of a float32
    SVD, 4 T eps sigma_1 with eps = 2^-23 for every sigma_i (the Krylov run from 512
    tokens meets it, below), the gap 8 T eps sigma_1 and the stable rank 8 T eps relative
    (||A||_F^2 is summed in float64 from squares rounded once to float32).  That is the
    order of what the run's own rounding of the probabilities already moves them: each
    entry carries a relative rounding of 2^-24 or more (bfloat16: 2^-8), so the matrix is
    off by up to 2^-24 ||A||_F <= 2^-24 sqrt(T) sigma_1 in spectral norm, and Weyl's
    inequality moves every singular value by as much.
  Tests hold each dtype to its bound against numpy's float64 SVD of the same entries.
  From 512 tokens on, where causal rows give a decaying top (a random-init Llama layer at
  1024 tokens: sigma_1 : sigma_2 : sigma_3 ~ 1.78 : 1.35 : 1.0), ``krylov_top_two`` first
  runs a block Krylov space of A^T A (block 4, at most 12 blocks, a fixed start block, full
  reorthogonalisation; the products A V and (A V)^T A only, O(T^2) each) and takes the Ritz
  values, the singular values of A V, which never exceed the exact ones.  It accepts a
  matrix's sigma_1, sigma_2 at the first step where the residuals r_i = ||A^T u_i - s_i v_i||
  of the top Ritz pairs satisfy r_i^2 <= (T eps s_1 / 4) g_i, g_i the Ritz gap around s_i
  and g_2 > 4 r_3 (s_3 within a quarter of g_2 of an exact singular value, so that, short of
  one the space missed, the exact gap around s_i is at least 3/4 g_i; Kato-Temple for the
  symmetric [[0, A], [A^T, 0]] then gives |s_i - sigma_i| <= r_i^2 / (2 (3/4) g_i) <= T eps
  s_1 / 6), the basis orthonormal to T eps (the run is in the working precision, and eps is
  its own); a matrix that does not pass within 12 blocks (a flat or degenerate top: rank
  one, sharp near one-hot rows, a permutation) gets the dense path (``_dense_top_two``).
  The accuracy is then the dense path's, and tests/test_attention_krylov.py pins the same 4 T
  eps sigma_1 against numpy's SVD on causal, padded, flat, rank-one and identity matrices.
  The values are not bit for bit the dense SVD's (other rounding), within that accuracy; a
  matrix's values do not depend on its batch.  On CUDA the run stays on the device without a
  per-matrix QR or SVD (``krylov_top_two``'s ``batched``), under the same residual test.
  What no residual test can see is a singular value whose vector is exactly orthogonal to
  the start block's Krylov space; a fixed random start makes that a measure-zero event.
  Cost: docs/attention.md, Cost.

Hidden-state statistics of one layer's output: :mod:`probe.measures.hidden_stats`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from probe.errors import ProbeError
from probe.linalg.lapack import lapack
from probe.measures.hidden_stats import anisotropy_sums, massive_sums
from probe.requests.checks import plain

#: Gu et al.'s threshold for Sink_eps.
EPSILON = 0.3


def check_epsilon(epsilon) -> float:
    """eps as a float in (0, 1), or one line naming `epsilon`."""
    number = plain(epsilon)  # a numpy scalar as the number it holds
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 < number < 1:
        raise ProbeError(f"`epsilon` must be a number strictly between 0 and 1, got {epsilon!r}")
    return float(number)


def _real_only(probs: Tensor, real: Tensor) -> Tensor:
    """(B, H, T, T) in its own dtype with the padding rows and columns set to 0 (a selection,
    exact in any dtype); a batch without padding as it is."""
    if bool(real.all()):
        return probs
    keep = real[:, None, :, None] & real[:, None, None, :]
    return torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))


def head_sums(
    probs: Tensor,
    real: Tensor,
    seen: Tensor | None = None,
    spectrum: bool = True,
    epsilon: float = EPSILON,
    outside: bool = False,
) -> dict[str, Tensor]:
    """One layer's attention statistics of one batch, summed over its sequences.

    ``probs``: (batch, head, query, key); ``real``: (batch, token) bool; ``seen``: (batch, 1
    or head, query, key) bool, the real pairs the run's mask opened (None: all of them), over
    whose rows each key's received attention is the mean.  Returns ``received`` (head, key),
    ``sinks`` (head,: the sequences whose first-key score exceeds ``epsilon``), ``entropy``,
    ``gap``, ``stable_rank`` (head,) and ``count`` (sequences); each a sum over sequences of
    a per-sequence value (see the module docstring).  ``outside``: the rows' mass outside the
    keys is a learned sink's (GPT-OSS): counted in the entropy, and summed as ``outside``.
    """
    real = real.bool()
    A = _real_only(probs, real)  # (B, H, T, T), the input's dtype
    rows = real.sum(1).to(torch.float64)  # (B,) real query rows
    if seen is None:
        per_key = rows[:, None, None]
    else:  # the real rows that saw each key; a key no row saw received 0 (divided by 1)
        per_key = seen.sum(-2, dtype=torch.float64).clamp_min(1)  # (B, 1 or H, T)
    # The sums over rows and the logs in the working precision, the rest in float64 (module
    # docstring: accuracy per dtype).
    work = A.to(working_dtype(A.dtype))  # A itself in a float32 or float64 run
    # Mean over the rows that see each key, per sequence.
    per_sequence = work.sum(2).to(torch.float64) / per_key  # (B, H, T)
    received = per_sequence.sum(0)  # (H, T)
    sinks = (per_sequence[:, :, 0] > epsilon).sum(0, dtype=torch.float64)  # (H,)
    terms = torch.special.xlogy(work, work).sum(-1).to(torch.float64)  # (B, H, T)
    out = {"sinks": sinks, "count": torch.tensor(float(A.shape[0]))}
    if outside:  # the learned sink's share of each real row, one more outcome of the row
        rest = (1 - work.sum(-1).to(torch.float64)).clamp_min(0) * real[:, None, :]
        terms = terms + torch.special.xlogy(rest, rest)
        out["outside"] = (rest.sum(-1) / rows[:, None]).sum(0)  # (H,)
    entropy = (-terms.sum(-1) / rows[:, None]).sum(0)  # (H,)
    out |= {"received": received, "entropy": entropy}
    if spectrum:
        sigma_1, sigma_2, frobenius = top_two(work)  # each (B, H)
        out |= {"gap": (sigma_1 - sigma_2).sum(0), "stable_rank": (frobenius / sigma_1**2).sum(0)}
    return out


def top_two(A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """sigma_1, sigma_2 and ||A||_F^2 = sum_i sigma_i^2 of every (..., T, T) matrix, as float64
    tensors, to float64's accuracy for a float64 ``A`` and to float32's for any other dtype
    (module docstring: method and accuracy per dtype).  A 1 x 1 matrix has sigma_2 = 0."""
    flat = A.reshape(-1, *A.shape[-2:])
    if flat.device.type == "cpu" or flat.shape[-1] < KRYLOV_FROM:
        # From CUDA too below KRYLOV_FROM: the host's LAPACK, the CPU's values bit for bit.
        [(sigma, frobenius)] = lapack(_top_two, flat)
    else:
        sigma, frobenius = _top_two(flat)
    sigma = sigma.to(torch.float64).reshape(*A.shape[:-2], 2)
    return sigma[..., 0], sigma[..., 1], frobenius.reshape(A.shape[:-2])


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision the attention statistics work in: float64 for a float64 run, float32
    for float32, bfloat16 and float16 (the accuracy of the arithmetic that made the
    probabilities)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


#: From this size on, sigma_1 and sigma_2 come from a block Krylov run (module docstring),
#: below it from the dense SVD: at 128 tokens the random-init bulk under sigma_1 is flat.
KRYLOV_FROM = 512
#: The Krylov run's block size and its most steps (a basis of at most 48 vectors).
BLOCK, MOST_STEPS = 4, 12


def _top_two(A: Tensor) -> tuple[Tensor, Tensor]:
    # One piece of the batch, in a LAPACK worker on a CPU: the working copy (float64, or
    # float32 from a half-precision run) is made here, a piece at a time, so that it too runs
    # on every thread.  ||A||_F^2 is summed in float64 either way.
    A = A.to(working_dtype(A.dtype))
    frobenius = A.square().sum((-2, -1), dtype=torch.float64)
    if A.shape[-1] >= KRYLOV_FROM:
        sigma, done = krylov_top_two(A)
        if not bool(done.all()):  # the dense path where the run did not converge
            sigma[~done] = lapack(_dense_top_two, A[~done])[0].to(A.dtype)
        return sigma, frobenius
    return _dense_top_two(A), frobenius


def _dense_top_two(A: Tensor) -> Tensor:
    """sigma_1, sigma_2 (n, 2) of each (n, T, T) matrix in the working precision, all of
    its spectrum computed: a float64 A's singular values, a float32 A's from the two largest
    eigenvalues of its Gram matrix in float64, where the products are exact."""
    if A.dtype == torch.float64:
        sigma = torch.linalg.svdvals(A)[:, :2]  # descending
    else:
        exact = A.to(torch.float64)
        top = torch.linalg.eigvalsh(exact @ exact.mT)[:, -2:]  # ascending
        sigma = top.flip(-1).clamp_min(0).sqrt()
    return torch.nn.functional.pad(sigma, (0, 2 - sigma.shape[-1]))


def krylov_top_two(A: Tensor, batched: bool | None = None) -> tuple[Tensor, Tensor]:
    """sigma_1, sigma_2 of each (n, T, T) matrix from a block Krylov space of A^T A, in A's
    dtype (float64 or float32) and to its eps, and which of them passed the residual test
    (module docstring); the others are 0.

    ``batched`` (the default off a CPU): the block's orthonormalisation and the Ritz step
    without a QR or an SVD per matrix, which cuSOLVER runs one matrix at a time (a layer's
    many T x 4 and T x 48 problems then cost more than its products): the block projected
    off the basis and its columns orthonormalised one by one, twice (``_gram_schmidt``); the
    Ritz vectors from the small B^T B on the host's LAPACK (``_ritz``).  The same residual
    test certifies either."""
    n, T, _ = A.shape
    if batched is None:
        batched = A.device.type != "cpu"
    sigma = torch.zeros(n, 2, dtype=A.dtype, device=A.device)
    done = torch.zeros(n, dtype=torch.bool, device=A.device)
    # The same fixed start for every matrix (no seed of the run's): a matrix's values then
    # depend on it alone, not on the batch or the split over threads.
    start = torch.randn(T, BLOCK, generator=torch.Generator().manual_seed(0), dtype=A.dtype)
    V = [torch.linalg.qr(start).Q.to(A.device).expand(n, T, BLOCK)]
    AV, AtAV = [A @ V[0]], []
    for step in range(MOST_STEPS):
        # A^T (A V) as ((A V)^T A)^T: torch copies a transposed A before a product, this not.
        # It is the next block and also gives the residuals below without another product.
        AtAV.append((AV[-1].mT @ A).mT)
        if step >= 3:
            sigma, done = _certify(
                torch.cat(V, -1), torch.cat(AV, -1), torch.cat(AtAV, -1), sigma, done, batched
            )
            if bool(done.all()):
                break
        if step < MOST_STEPS - 1:
            basis, W = torch.cat(V, -1), AtAV[-1]
            if batched:
                W = _gram_schmidt(W, basis)
            else:
                for _ in range(2):  # full reorthogonalisation, twice (Gram-Schmidt's rule of two)
                    W = torch.linalg.qr(W - basis @ (basis.mT @ W)).Q
            V.append(W)
            AV.append(A @ W)
    return sigma, done


def _gram_schmidt(W: Tensor, basis: Tensor) -> Tensor:
    """W's columns made orthonormal to ``basis`` and to each other without a QR: W projected
    off the basis in one product, its columns orthonormalised one by one with elementwise
    sums, the whole twice (the rule of two, as the QR path).  A column that is rounding alone
    after the projection comes out unit but not orthogonal: the residual test's check of the
    basis (``drift``) then keeps that matrix from passing.  Every product has W's 4 columns,
    so a matrix meets the same kernels alone as in a batch (a 1-column product is a gemv
    alone but not in a batch: other rounding)."""
    tiny = torch.finfo(W.dtype).tiny
    for _ in range(2):
        W = W - basis @ (basis.mT @ W)
        columns: list[Tensor] = []
        for j in range(W.shape[-1]):
            w = W[..., j : j + 1]
            for q in columns:
                w = w - q * (q * w).sum(-2, keepdim=True)
            columns.append(w / w.norm(dim=-2, keepdim=True).clamp_min(tiny))
        W = torch.cat(columns, -1)
    return W


def _ritz(B: Tensor, batched: bool) -> tuple[Tensor, Tensor]:
    """The top three Ritz values s (n, 3) and vectors Y (n, m, 3) of B = A V.

    Batched: Y from the symmetric m x m B^T B on the host's LAPACK and s_i = ||B y_i||, the
    Rayleigh quotient of the pair (A v_i / s_i, v_i) that the residual test bounds, accurate
    to eps relative whatever B^T B's squaring lost in y_i (second order in y_i's error)."""
    if not batched:
        _, S, Yh = torch.linalg.svd(B, full_matrices=False)  # Ritz values: A V = U S Y^T
        return S[..., :3], Yh[..., :3, :].mT
    [(_, vectors)] = lapack(torch.linalg.eigh, B.mT @ B)  # ascending
    Y = vectors[..., -3:].flip(-1)
    return (B @ Y).norm(dim=-2), Y


def _certify(basis: Tensor, B: Tensor, AtB: Tensor, sigma: Tensor, done: Tensor, batched: bool):
    """The Rayleigh-Ritz step on the basis V (B = A V, AtB = A^T A V) and the residual test
    (module docstring): ``sigma`` and ``done`` with the matrices that pass now added; each
    matrix keeps the values of the first step it passed."""
    T = basis.shape[-2]
    eps = torch.finfo(B.dtype).eps
    S, Y = _ritz(B, batched)
    s = S[..., None, :]
    # r_i = ||A^T u_i - s_i v_i|| with v_i = V y_i and u_i = A v_i / s_i (so A v_i = s_i u_i).
    r = ((AtB @ Y) / s - basis @ (Y * s)).norm(dim=-2)
    gap_1 = S[:, 0] - S[:, 1]
    gap_2 = torch.minimum(gap_1, S[:, 1] - S[:, 2])
    tol = T * eps * S[:, 0] / 4
    drift = basis.mT @ basis - torch.eye(basis.shape[-1], dtype=B.dtype, device=B.device)
    passed = (
        (r[:, 0] ** 2 <= tol * gap_1)
        & (r[:, 1] ** 2 <= tol * gap_2)
        & (gap_2 > 4 * r[:, 2])  # a 0 Ritz value gives nan residuals: not passed
        & (drift.abs().amax((-2, -1)) <= T * eps)
    )
    new = passed & ~done
    sigma[new] = S[new, :2]
    return sigma, done | passed


@dataclass
class Totals:
    """One init's sums over every batch, per layer; the statistics once all are in."""

    layers: int
    heads: dict[int, dict[str, Tensor]] = field(default_factory=dict)  # layer 1..L
    massive: dict[int, dict[str, Tensor]] = field(default_factory=dict)  # layer 0..L
    aniso: dict[int, dict[str, Tensor]] = field(default_factory=dict)

    def add_heads(self, layer: int, sums: dict[str, Tensor]) -> None:
        _add(self.heads, layer, {k: v.cpu() for k, v in sums.items()})

    def add_hidden(self, layer: int, x: Tensor, real: Tensor, first: int) -> None:
        m = {k: v.cpu() for k, v in massive_sums(x, real).items()}
        old = self.massive.get(layer)
        if old is None or float(m["largest"]) > float(old["largest"]):
            largest, where = m["largest"], m["where"] + torch.tensor([first, 0, 0])
        else:
            largest, where = old["largest"], old["where"]
        for key in ("top", "median"):
            m[key] = m[key] + (old[key] if old is not None else 0.0)
        self.massive[layer] = m | {"largest": largest, "where": where}
        _add(self.aniso, layer, {k: v.cpu() for k, v in anisotropy_sums(x, real).items()})

    def attention(self) -> dict[str, Tensor]:
        """(layer, head) statistics: sink_score, sink_frequency, top_key, top_key_score,
        attention_entropy, attention_gap, attention_stable_rank (layers 1..L, in order)."""
        out: dict[str, list[Tensor]] = {}
        for layer in sorted(self.heads):
            sums = self.heads[layer]
            received = sums["received"] / sums["count"]  # (H, T)
            score, key = received.max(-1)
            values = {
                "sink_score": received[:, 0],
                "sink_frequency": sums["sinks"] / sums["count"],
                "top_key": key,
                "top_key_score": score,
                "attention_entropy": sums["entropy"] / sums["count"],
            }
            if "outside" in sums:
                values["learned_sink_share"] = sums["outside"] / sums["count"]
            if "gap" in sums:
                values["attention_gap"] = sums["gap"] / sums["count"]
                values["attention_stable_rank"] = sums["stable_rank"] / sums["count"]
            for name, value in values.items():
                out.setdefault(name, []).append(value)
        return {name: torch.stack(v) for name, v in out.items()}

    def hidden(self) -> dict[str, Tensor]:
        """Per layer 0..L: massive_ratio, massive_sequence, massive_token, massive_dim,
        anisotropy."""
        ratio, where, aniso = [], [], []
        for layer in sorted(self.massive):
            m, a = self.massive[layer], self.aniso[layer]
            ratio.append(m["top"] / m["median"])
            where.append(m["where"])
            across = a["tokens"] ** 2 - a["pairs_within"]
            cross = (a["total"] ** 2).sum() - a["within"]
            aniso.append(cross / across if across > 0 else torch.tensor(float("nan")))
        where_ = torch.stack(where)
        return {
            "massive_ratio": torch.stack(ratio),
            "massive_sequence": where_[:, 0],
            "massive_token": where_[:, 1],
            "massive_dim": where_[:, 2],
            "anisotropy": torch.stack(aniso).to(torch.float64),
        }


def sink_rate(sink_frequency: Tensor) -> Tensor:
    """Gu et al.'s Sink_eps from the (layer, head) ``sink_frequency``: the share of (sequence,
    layer, head) triples whose first-key score exceeds eps (every head sees every sequence)."""
    return sink_frequency.to(torch.float64).mean()


def sink_head_share(sink_score: Tensor, epsilon: float = EPSILON) -> Tensor:
    """The share of (layer, head) pairs whose mean ``sink_score`` exceeds eps: a threshold of
    the mean over sequences, not Gu et al.'s Sink_eps (:func:`sink_rate`), which thresholds
    each sequence first."""
    return (sink_score > check_epsilon(epsilon)).to(torch.float64).mean()


def _add(store: dict[int, dict[str, Tensor]], layer: int, sums: dict[str, Tensor]) -> None:
    if layer not in store:
        store[layer] = sums
    else:
        store[layer] = {k: store[layer][k] + v for k, v in sums.items()}
