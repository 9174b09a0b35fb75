"""Causal additive pooling, computed without overflow.

Fastformer (Wu et al. 2021) pools a sequence x_1..x_T into one vector with a
learned vector w: per head (size s), score_j = <x_j, w> / sqrt(s) + M_j (M_j =
-10000 at padding), and the causal language model needs, at every position i,
the average over the prefix (the seed write-up's equations 5-8):

    g_i = sum_{j<=i} exp(score_j) x_j / sum_{j<=i} exp(score_j).

The naive form keeps two cumulative sums of exp(score) and overflows as soon
as a score passes ~88 (float32), or underflows to 0/0 when every score of a
prefix is below ~-104.  Here every weight is taken relative to the running
maximum m_i = max_{j<=i} score_j, which is exact algebra (the factor exp(-m_i)
cancels between numerator and denominator) and keeps each exponent <= 0 with
at least one term equal to 1, so nothing overflows and the denominator is >= 1.

The sequence is processed in blocks of ``block`` positions (an online softmax
over blocks): inside a block the weights exp(score_j - m_i), j <= i, form a
small lower-triangular matrix; the sums over earlier blocks are carried,
referenced to the previous block's last maximum, and rescaled by
exp(m_prev - m_i) <= 1.  Cost O(T * block * d), memory O(block^2) per head.
"""

from __future__ import annotations

import math

import torch

#: Additive score of a padding position (the checkpoint format's mask term).
MASK_SCORE = -10000.0
BLOCK = 64


def pooling_scores(
    x: torch.Tensor, w: torch.Tensor, n_heads: int, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """score_j per head: (batch, token, hidden) -> (batch, head, token)."""
    batch, tokens, hidden = x.shape
    size = hidden // n_heads
    heads = (x * w).view(batch, tokens, n_heads, size)  # (batch, token, head, size)
    scores = heads.sum(-1).transpose(1, 2) / math.sqrt(size)  # (batch, head, token)
    if attention_mask is not None:
        scores = scores + (1.0 - attention_mask[:, None, :].to(scores.dtype)) * MASK_SCORE
    return scores


def causal_pool(
    x: torch.Tensor,
    w: torch.Tensor,
    n_heads: int,
    attention_mask: torch.Tensor | None = None,
    state: PoolState | None = None,
    block: int = BLOCK,
) -> tuple[torch.Tensor, PoolState]:
    """g_i for every position (batch, token, hidden), and the state after the last one.

    ``state`` continues a sequence whose earlier positions were pooled before
    (generation with a cache): the result equals pooling the whole sequence.
    """
    batch, tokens, hidden = x.shape
    size = hidden // n_heads
    scores = pooling_scores(x, w, n_heads, attention_mask)  # (batch, head, token)
    values = x.view(batch, tokens, n_heads, size).transpose(1, 2)  # (batch, head, token, size)
    # The reference maximum is a constant of the algebra: no gradient flows through it.
    running = torch.cummax(scores.detach(), dim=-1).values  # (batch, head, token)
    if state is not None:
        running = torch.maximum(running, state.max[..., None])
    outputs = []
    for start in range(0, tokens, block):
        stop = min(start + block, tokens)
        s, m = scores[..., start:stop], running[..., start:stop]  # (batch, head, b)
        v = values[:, :, start:stop]  # (batch, head, b, size)
        n = stop - start
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        exponent = s[..., None, :] - m[..., :, None]  # (batch, head, i, j): score_j - m_i
        weights = torch.where(causal, exponent, -math.inf).exp()  # (batch, head, i, j)
        numerator = weights @ v  # (batch, head, b, size)
        denominator = weights.sum(-1)  # (batch, head, b)
        if state is not None:
            carry = (state.max[..., None] - m).exp()  # (batch, head, b), <= 1
            numerator = numerator + carry[..., None] * state.numerator[:, :, None, :]
            denominator = denominator + carry * state.denominator[..., None]
        outputs.append(numerator / denominator[..., None])
        # Carry the block's sums, referenced to its last maximum.
        last = m[..., -1]  # (batch, head)
        tail = (s - last[..., None]).exp()  # (batch, head, b), <= 1
        num = (tail[..., None] * v).sum(-2)  # (batch, head, size)
        den = tail.sum(-1)  # (batch, head)
        if state is not None:
            back = (state.max - last).exp()
            num = num + back[..., None] * state.numerator
            den = den + back * state.denominator
        state = PoolState(max=last, numerator=num, denominator=den)
    pooled = torch.cat(outputs, dim=2).transpose(1, 2).reshape(batch, tokens, hidden)
    return pooled, state


def naive_causal_pool(
    x: torch.Tensor, w: torch.Tensor, n_heads: int, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The cumulative-sum form of equations 5-8, as written; overflows for large scores."""
    batch, tokens, hidden = x.shape
    size = hidden // n_heads
    e = pooling_scores(x, w, n_heads, attention_mask).exp()  # (batch, head, token)
    values = x.view(batch, tokens, n_heads, size).transpose(1, 2)  # (batch, head, token, size)
    pooled = (e[..., None] * values).cumsum(2) / e.cumsum(-1)[..., None]
    return pooled.transpose(1, 2).reshape(batch, tokens, hidden)


def pooling_weights(
    x: torch.Tensor, w: torch.Tensor, n_heads: int, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """a_ij = exp(score_j) / sum_{j'<=i} exp(score_j'), j <= i: (batch, head, token, token).

    Lower-triangular and row-stochastic: the Fastformer's attention matrix, with
    g = a @ x per head.  O(T^2) memory; meant for analysis, not for the forward.
    """
    scores = pooling_scores(x, w, n_heads, attention_mask)  # (batch, head, token)
    tokens = scores.shape[-1]
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).tril()
    logits = torch.where(causal, scores[..., None, :], -math.inf)  # (batch, head, i, j)
    return logits.softmax(-1)


class PoolState:
    """Sums over the positions pooled so far, referenced to their maximum score.

    ``max`` (batch, head); ``numerator`` (batch, head, size) = sum exp(score_j -
    max) x_j; ``denominator`` (batch, head) = sum exp(score_j - max).
    """

    __slots__ = ("max", "numerator", "denominator")

    def __init__(self, max: torch.Tensor, numerator: torch.Tensor, denominator: torch.Tensor):
        self.max, self.numerator, self.denominator = max, numerator, denominator

    def select(self, index: torch.Tensor) -> PoolState:
        """The states of the batch rows in ``index`` (for beam search's reordering)."""
        return PoolState(self.max[index], self.numerator[index], self.denominator[index])
