"""Attention statistics from HuggingFace's own ``output_attentions`` (imports nothing from probe).

``attentions``: (layer, sequence, head, query, key) float64 numpy, as HF returns them;
``mask``: (sequence, token), 1 = real token.  Written with plain loops over sequences and
rows, straight from the definitions: a padding query row is dropped, a padding key receives
nothing, every per-sequence mean is over that sequence's real query rows, then the mean over
sequences.

In a causal model (``causal=True``) the received attention of key k divides by the real
rows that can see it (query i >= k), as Gu et al.'s importance score does (sail-sg/
Attention-Sink, ``compute_attention_sink``: sum over rows / (T - k)); the first key is seen
by every row, so the sink score is the same either way.  Gu et al.'s Sink_eps thresholds
each sample's first-key score at eps, then averages the indicator over samples, layers and
heads: ``sink_rate``.
"""

from __future__ import annotations

import numpy as np


def statistics(
    attentions: np.ndarray, mask: np.ndarray, causal: bool = False, epsilon: float = 0.3
) -> dict[str, np.ndarray]:
    """``sink_score``, ``attention_entropy`` (nats) and ``top_key``, each (layer, head), the
    ``received`` attention (layer, head, key) and Gu et al.'s ``sink_rate`` (a number)."""
    L, B, H, T, _ = attentions.shape
    received = np.zeros((L, H, T))
    entropy = np.zeros((L, H))
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
                seen_by = np.array(
                    [sum(1 for i in real if i >= k) if causal else len(real) for k in range(T)]
                )
                score = np.where(seen_by > 0, column / np.maximum(seen_by, 1), 0.0)
                received[layer, h] += score / B
                entropy[layer, h] += row_entropy / len(real) / B
                sinks += int(score[0] > epsilon)
    return {
        "sink_score": received[:, :, 0],
        "attention_entropy": entropy,
        "top_key": received.argmax(-1),
        "received": received,
        "sink_rate": sinks / (L * H * B),
    }
