"""The hidden-state statistics of :mod:`probe.measures.attention_stats`' analysis.

Hidden-state statistics of one layer's output X (sequence, token, hidden):

* ``massive_ratio`` (Sun et al. 2024): the mean over sequences of the largest |entry| of the
  sequence's real tokens, over the mean over sequences of the median |entry| (torch's median:
  the lower one of an even count), as Sun et al. average the top and median magnitudes over
  their sequences.  ``massive_token`` / ``massive_dim`` (and the sequence) locate the largest
  |entry| of the whole run.  Top and median are selections, exact in the output's own dtype;
  the sequences of one real length go at once, and their sums are added in sequence order.
* ``anisotropy`` (Ethayarajh 2019): the mean cosine between the representations of two real
  tokens of *different* sequences, over every such pair, computed exactly from the unit
  vectors u: (||sum u||^2 - sum_s ||sum_{t in s} u_t||^2) / (N^2 - sum_s n_s^2).  This is
  the expectation of Ethayarajh's estimate (pairs of tokens drawn uniformly from different
  contexts), with no sampling noise and no seed; a zero vector counts as cosine 0.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def massive_sums(x: Tensor, real: Tensor) -> dict[str, Tensor]:
    """One layer's output (batch, token, hidden): the sums of the per-sequence top and median
    |entry|, and where the batch's largest |entry| is (``where``: sequence, token, dim)."""
    real = real.bool()
    B, _, D = x.shape
    a = x.detach().abs()  # in x's dtype: the top and the median are selections, exact
    tops = torch.empty(B, dtype=a.dtype, device=a.device)
    medians, at = torch.empty_like(tops), torch.empty(B, dtype=torch.long, device=a.device)
    lengths = real.sum(1)
    # The sequences of one real length at once: their real tokens as one (group, n_s D) row
    # each (a batch without padding is one group and needs no copy).
    for n in lengths.unique().tolist():
        group = (lengths == n).nonzero()[:, 0]
        flat = a.flatten(1) if len(group) == B and n == a.shape[1] else a[group][real[group]]
        flat = flat.reshape(len(group), n * D)
        tops[group], at[group] = flat.max(1)  # the first of equal maxima, as flatten().max()
        medians[group] = lower_median(flat)
    # Sums in sequence order (cumsum is sequential), as the per-sequence loop added them.
    top = tops.to(torch.float64).cumsum(0)[-1]
    median = medians.to(torch.float64).cumsum(0)[-1]
    s = int(tops.argmax())  # the first sequence holding the batch's largest |entry|
    flat_at = int(at[s])
    token = int(real[s].nonzero()[flat_at // D, 0])
    largest = tops[s].to(torch.float64).cpu()
    return {
        "top": top,
        "median": median,
        "largest": largest,
        "where": torch.tensor((s, token, flat_at % D)),
    }


def lower_median(rows: Tensor) -> Tensor:
    """Each row's median as torch's ``median(1)`` gives it: the lower middle value of an
    even count, the ((n - 1) // 2)-th smallest.  A selection, exact; on a CPU (float32,
    float64) from numpy's introselect, a quarter of torch's time at 128 x 768 entries."""
    if rows.device.type != "cpu" or rows.dtype not in (torch.float32, torch.float64):
        return rows.median(1).values
    k = (rows.shape[1] - 1) // 2
    return torch.from_numpy(np.partition(rows.numpy(), k, axis=1)[:, k].copy())


def anisotropy_sums(x: Tensor, real: Tensor) -> dict[str, Tensor]:
    """One layer's output (batch, token, hidden): the sums the exact cross-sequence mean
    cosine needs (module docstring): sum u (hidden,), sum_s ||S_s||^2, N and sum_s n_s^2."""
    copied = x.dtype != torch.float64
    x = x.to(torch.float64)
    if not bool(real.all()):
        x, copied = x * real[..., None].to(torch.float64), True
    norms = x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    # A zero vector stays 0.  In place where x is this function's own copy (one allocation
    # the less, the same division), never on the caller's tensor.
    u = x.div_(norms) if copied else x / norms
    per_sequence = u.sum(1)  # (B, D)
    n = real.sum(1).to(torch.float64)
    return {
        "total": per_sequence.sum(0),
        "within": (per_sequence**2).sum(),
        "tokens": n.sum(),
        "pairs_within": (n**2).sum(),
    }
