"""What trained transformers do instead of collapsing: the attention and activation statistics.

Pure tensor functions, in float64, on real (unpadded) tokens only.  Each takes one batch and
returns *sums over its sequences* (and the counts to divide them by), so a run adds batches
up and divides once (:class:`Totals`); only per-(layer, head) numbers and a few vectors of
the hidden size ever leave a layer.

Attention statistics of one layer's probabilities A (sequence s, head h, query i, key k),
rows and columns restricted to the sequence's real tokens (a padding row is dropped; a
padding key receives nothing), each averaged over the real query rows of a sequence, then
over sequences:

* received attention r_hk = mean_s mean_i A_sh[i, k]; a row that cannot see key k (a causal
  mask) holds 0 there and counts as 0.  ``sink_score`` is r_h0, the attention the first
  token receives (Gu et al. 2025; Xiao et al. 2023); ``top_key`` the argmax over k of r_hk and
  ``top_key_score`` its value (Clark et al. 2019: BERT's [CLS] and [SEP]).
* ``attention_entropy``: mean_s mean_i -sum_k A_ik log A_ik, in nats (0 log 0 = 0, so the
  keys a row cannot see add nothing).
* ``attention_gap`` sigma_1 - sigma_2 and ``attention_stable_rank`` sum_i sigma_i^2 /
  sigma_1^2 of each sequence's n_s x n_s matrix A_sh (Nait Saada et al. 2025), mean over
  sequences.  Only three numbers of each matrix are needed (``top_two``): sum_i sigma_i^2 =
  ||A||_F^2, exactly, from the entries (a sum of squares: relative error ~log2(T^2) eps), and
  sigma_1, sigma_2.  The padding rows and columns are zero, which adds only zero singular
  values, so the whole layer's (sequence x head) T x T matrices go at once.  sigma_1 and
  sigma_2 come from LAPACK's singular values (gesdd without vectors), on a CPU through
  ``probe.linalg.lapack``: one serial LAPACK call per matrix, the batch split over the
  threads (a bert-base layer at 32 x 128 on 2 loaded cores: 2.2 s against 53 s for torch's
  per-sequence calls, whose MKL threading of each small matrix collapses under load); on
  CUDA torch's ``svdvals`` on the device.  LAPACK still computes all T values, O(T^3) per
  matrix: at T in the thousands a Krylov method for the top two would cost less.  Accuracy: LAPACK's, backward stable, every
  singular value within a few T eps sigma_1 of the exact one (tests/test_attention_stats.py
  pins |error| <= 4 T eps sigma_1 against numpy's float64 SVD on near-uniform, clustered
  near-permutation, causal, padded and Dirichlet matrices): sigma_1 relative ~T eps, sigma_2
  absolute ~T eps sigma_1 (relative <= 1e-9 where sigma_2 > 1e-3 sigma_1, T <= 1024), the
  gap absolute ~2 T eps sigma_1, the stable rank relative ~2 T eps.  Not bit for bit the
  values of the earlier per-sequence ``svdvals`` (other rounding), within that accuracy.
* Gu et al.'s sink rate, Sink_eps: the share of (layer, head) pairs with r_h0 > eps.

Hidden-state statistics of one layer's output X (sequence, token, hidden):

* ``massive_ratio`` (Sun et al. 2024): the mean over sequences of the largest |entry| of the
  sequence's real tokens, over the mean over sequences of the median |entry| (torch's median:
  the lower one of an even count), as Sun et al. average the top and median magnitudes over
  their sequences.  ``massive_token`` / ``massive_dim`` (and the sequence) locate the largest
  |entry| of the whole run.
* ``anisotropy`` (Ethayarajh 2019): the mean cosine between the representations of two real
  tokens of *different* sequences, over every such pair, computed exactly from the unit
  vectors u: (||sum u||^2 - sum_s ||sum_{t in s} u_t||^2) / (N^2 - sum_s n_s^2).  This is
  the expectation of Ethayarajh's estimate (pairs of tokens drawn uniformly from different
  contexts), with no sampling noise and no seed; a zero vector counts as cosine 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .errors import ProbeError
from .linalg.lapack import lapack

#: Gu et al.'s threshold for Sink_eps.
EPSILON = 0.3


def check_epsilon(epsilon) -> float:
    """eps as a float in (0, 1), or one line naming `epsilon`."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not 0 < epsilon < 1:
        raise ProbeError(f"`epsilon` must be a number strictly between 0 and 1, got {epsilon!r}")
    return float(epsilon)


def _masked(probs: Tensor, real: Tensor) -> Tensor:
    """(B, H, T, T) float64 with the padding rows and columns set to 0."""
    keep = real.to(torch.float64)
    return probs.to(torch.float64) * keep[:, None, :, None] * keep[:, None, None, :]


def head_sums(probs: Tensor, real: Tensor, spectrum: bool = True) -> dict[str, Tensor]:
    """One layer's attention statistics of one batch, summed over its sequences.

    ``probs``: (batch, head, query, key); ``real``: (batch, token) bool.  Returns
    ``received`` (head, key), ``entropy``, ``gap``, ``stable_rank`` (head,) and ``count``
    (sequences); each a sum over sequences of a per-sequence mean (see the module docstring).
    """
    A = _masked(probs, real)  # (B, H, T, T)
    rows = real.sum(1).to(torch.float64)  # (B,) real query rows
    per_row = rows[:, None, None]
    received = (A.sum(2) / per_row).sum(0)  # (H, T): mean over rows, summed over sequences
    entropy = (-torch.special.xlogy(A, A).sum(-1).sum(-1) / rows[:, None]).sum(0)  # (H,)
    out = {"received": received, "entropy": entropy, "count": torch.tensor(float(A.shape[0]))}
    if spectrum:
        sigma_1, sigma_2, frobenius = top_two(A)  # each (B, H)
        out |= {"gap": (sigma_1 - sigma_2).sum(0), "stable_rank": (frobenius / sigma_1**2).sum(0)}
    return out


def top_two(A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """sigma_1, sigma_2 and ||A||_F^2 = sum_i sigma_i^2 of every (..., T, T) float64 matrix
    (module docstring: method and accuracy).  A 1 x 1 matrix has sigma_2 = 0."""
    frobenius = A.square().sum((-2, -1))
    flat = A.reshape(-1, *A.shape[-2:])
    if flat.device.type == "cpu":
        [sigma] = lapack(torch.linalg.svdvals, flat)  # (matrices, T), descending
    else:
        sigma = torch.linalg.svdvals(flat)
    sigma = torch.nn.functional.pad(sigma[:, :2], (0, max(0, 2 - sigma.shape[-1])))
    sigma = sigma.reshape(*A.shape[:-2], 2)
    return sigma[..., 0], sigma[..., 1], frobenius


def massive_sums(x: Tensor, real: Tensor) -> dict[str, Tensor]:
    """One layer's output (batch, token, hidden): the sums of the per-sequence top and median
    |entry|, and where the batch's largest |entry| is (``where``: sequence, token, dim)."""
    top = torch.zeros((), dtype=torch.float64, device=x.device)
    median = torch.zeros_like(top)
    best, where = torch.tensor(-1.0, dtype=torch.float64), (0, 0, 0)
    for s in range(x.shape[0]):
        a = x[s].to(torch.float64).abs()  # (T, D)
        a = a[real[s].bool()]  # (n_s, D) real tokens
        flat_top, flat_at = a.flatten().max(0)
        top += flat_top
        median += a.flatten().median()
        if float(flat_top) > float(best):
            token = int(real[s].bool().nonzero()[int(flat_at) // a.shape[1], 0])
            best, where = flat_top.cpu(), (s, token, int(flat_at) % a.shape[1])
    return {"top": top, "median": median, "largest": best, "where": torch.tensor(where)}


def anisotropy_sums(x: Tensor, real: Tensor) -> dict[str, Tensor]:
    """One layer's output (batch, token, hidden): the sums the exact cross-sequence mean
    cosine needs (module docstring): sum u (hidden,), sum_s ||S_s||^2, N and sum_s n_s^2."""
    x = x.to(torch.float64) * real[..., None].to(torch.float64)
    norms = x.norm(dim=-1, keepdim=True)
    u = torch.where(norms > 0, x / norms.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    per_sequence = u.sum(1)  # (B, D)
    n = real.sum(1).to(torch.float64)
    return {
        "total": per_sequence.sum(0),
        "within": (per_sequence**2).sum(),
        "tokens": n.sum(),
        "pairs_within": (n**2).sum(),
    }


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
        """(layer, head) statistics: sink_score, top_key, top_key_score, attention_entropy,
        attention_gap, attention_stable_rank (layers 1..L, in order)."""
        out: dict[str, list[Tensor]] = {}
        for layer in sorted(self.heads):
            sums = self.heads[layer]
            received = sums["received"] / sums["count"]  # (H, T)
            score, key = received.max(-1)
            values = {
                "sink_score": received[:, 0],
                "top_key": key,
                "top_key_score": score,
                "attention_entropy": sums["entropy"] / sums["count"],
            }
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


def sink_rate(sink_score: Tensor, epsilon: float = EPSILON) -> Tensor:
    """Gu et al.'s Sink_eps: the share of (layer, head) pairs with sink_score > eps."""
    return (sink_score > check_epsilon(epsilon)).to(torch.float64).mean()


def _add(store: dict[int, dict[str, Tensor]], layer: int, sums: dict[str, Tensor]) -> None:
    if layer not in store:
        store[layer] = sums
    else:
        store[layer] = {k: store[layer][k] + v for k, v in sums.items()}
