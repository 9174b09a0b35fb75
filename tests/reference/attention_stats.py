"""Attention statistics from HuggingFace's own ``output_attentions`` (imports nothing from probe).

``attentions``: (layer, sequence, head, query, key) float64 numpy, as HF returns them;
``mask``: (sequence, token), 1 = real token.  Written with plain loops over sequences and
rows, straight from the definitions: a padding query row is dropped, a padding key receives
nothing, every per-sequence mean is over that sequence's real query rows, then the mean over
sequences.

``allowed`` (layer, query, key) bool says which keys each query saw in the run (padding
aside): the received attention of key k divides by the real rows i that saw it, as Gu et
al.'s importance score does in a causal model (sail-sg/Attention-Sink,
``compute_attention_sink``: sum over rows / (T - k)); None: every row saw every key.  Gu et
al.'s Sink_eps thresholds each sample's first-key score at eps, then averages the indicator
over samples, layers and heads: ``sink_rate``.  The gap and the stable rank are numpy's SVD
of each sequence's real n x n block.
"""

from __future__ import annotations

import numpy as np


def statistics(
    attentions: np.ndarray, mask: np.ndarray, allowed: np.ndarray | None = None,
    epsilon: float = 0.3, learned_sinks: bool = False,
) -> dict[str, np.ndarray]:  # fmt: skip
    """``sink_score``, ``sink_frequency``, ``top_key``, ``top_key_score``,
    ``attention_entropy`` (nats), ``attention_gap`` and ``attention_stable_rank``, each
    (layer, head), the ``received`` attention (layer, head, key) and Gu et al.'s
    ``sink_rate`` (a number).  ``learned_sinks``: the rows' mass outside the keys (1 minus
    the row's sum) is one more outcome of the row's distribution, counted in its entropy,
    and its mean over rows is ``learned_sink_share`` (layer, head)."""
    L, B, H, T, _ = attentions.shape
    received = np.zeros((L, H, T))
    entropy, gap, stable, frequency, outside = (np.zeros((L, H)) for _ in range(5))
    sinks = 0
    for layer in range(L):
        for h in range(H):
            for s in range(B):
                real = [t for t in range(T) if mask[s, t]]
                column = np.zeros(T)
                row_entropy = 0.0
                for i in real:
                    row = np.array([attentions[layer, s, h, i, k] if k in real else 0.0
                                    for k in range(T)])  # fmt: skip
                    column += row
                    row_entropy += -sum(p * np.log(p) for p in row if p > 0)
                    if learned_sinks:
                        rest = 1.0 - sum(row)
                        row_entropy += -rest * np.log(rest) if rest > 0 else 0.0
                        outside[layer, h] += rest / len(real) / B
                seen_by = np.array(
                    [
                        sum(1 for i in real if allowed is None or allowed[layer, i, k])
                        for k in range(T)
                    ]  # fmt: skip
                )
                score = np.where(seen_by > 0, column / np.maximum(seen_by, 1), 0.0)
                received[layer, h] += score / B
                entropy[layer, h] += row_entropy / len(real) / B
                sinks += int(score[0] > epsilon)
                frequency[layer, h] += int(score[0] > epsilon) / B
                block = attentions[layer, s, h][np.ix_(real, real)]
                sigma = np.linalg.svd(block, compute_uv=False)
                second = sigma[1] if len(sigma) > 1 else 0.0
                gap[layer, h] += (sigma[0] - second) / B
                stable[layer, h] += (sigma**2).sum() / sigma[0] ** 2 / B
    return {
        "sink_score": received[:, :, 0],
        "sink_frequency": frequency,
        "attention_entropy": entropy,
        "top_key": received.argmax(-1),
        "top_key_score": received.max(-1),
        "attention_gap": gap,
        "attention_stable_rank": stable,
        "received": received,
        "sink_rate": sinks / (L * H * B),
    } | ({"learned_sink_share": outside} if learned_sinks else {})
