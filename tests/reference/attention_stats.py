"""Attention statistics from HuggingFace's own ``output_attentions`` (imports nothing from probe).

``attentions``: (layer, sequence, head, query, key) float64 numpy, as HF returns them;
``mask``: (sequence, token), 1 = real token.  Written with plain loops over sequences and
rows, straight from the definitions (issue 29): a padding query row is dropped, a padding
key receives nothing, every per-sequence mean is over that sequence's real query rows, then
the mean over sequences.
"""

from __future__ import annotations

import numpy as np


def statistics(attentions: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """``sink_score``, ``attention_entropy`` (nats) and ``top_key``, each (layer, head)."""
    L, B, H, T, _ = attentions.shape
    received = np.zeros((L, H, T))
    entropy = np.zeros((L, H))
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
                received[layer, h] += column / len(real) / B
                entropy[layer, h] += row_entropy / len(real) / B
    return {
        "sink_score": received[:, :, 0],
        "attention_entropy": entropy,
        "top_key": received.argmax(-1),
        "received": received,
    }
