"""Data of the paper's trained experiments (Dong, Cordonnier & Loukas 2021, Section 4).

Every generator takes a ``numpy.random.Generator`` so one seed fixes the data.

- sort: sequences of ``length`` tokens drawn from ``symbols`` symbols, repeats
  allowed; the target at position i is the i-th smallest token.
- convex hull: ``points`` points uniform in the square [0, box]^2, shifted by
  one Gaussian offset of standard deviation ``shift`` per set (the paper's
  ``run_convex_hull.py``: box 10, shift 3.3); a point's label is 1 when it is a
  vertex of the set's convex hull (Andrew's monotone chain, below).
- memorization: natural text tokenized with the BERT vocabulary, cut into
  windows of ``tokens`` tokens, each token given a random binary label; the
  model must memorise the labels of its training set.
- circle: ``n`` points evenly spaced on a circle of radius 0.3; a sequence is
  two points, i and i + n/2 - 1 (one on each arc: the paper's ``run_circle.py``
  pairs a point with the one ``len(dataset) = n/2 - 1`` places on, just short
  of half a turn), and its target the pair one step further along the circle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from probe.errors import ProbeError


def sort_data(n: int, length: int, symbols: int, rng: np.random.Generator):
    """(tokens (n, length) int64, sorted targets (n, length) int64)."""
    x = rng.integers(0, symbols, size=(n, length), dtype=np.int64)
    return x, np.sort(x, axis=1)


def hull_vertices(points: np.ndarray) -> np.ndarray:
    """Boolean mask of the points that are vertices of their convex hull (k, 2) -> (k,).

    Andrew's monotone chain: sort by (x, y), build the lower and upper chains,
    popping while the last turn is not strictly counter-clockwise, so points on
    an edge (collinear) are not vertices.
    """
    order = np.lexsort((points[:, 1], points[:, 0]))

    def chain(indices) -> list[int]:
        kept: list[int] = []
        for i in indices:
            while len(kept) >= 2:
                o, a, b = points[kept[-2]], points[kept[-1]], points[i]
                if (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]) > 0:
                    break
                kept.pop()
            kept.append(int(i))
        return kept

    mask = np.zeros(len(points), dtype=bool)
    mask[chain(order)] = True
    mask[chain(order[::-1])] = True
    return mask


def hull_data(n: int, points: int, box: float, shift: float, rng: np.random.Generator):
    """(coordinates (n, points, 2) float32, on-hull labels (n, points) int64).

    Each set: ``points`` points uniform in [0, box]^2 plus one offset ~ N(0, shift^2 I)."""
    xy = box * rng.random((n, points, 2)) + rng.normal(0.0, shift, size=(n, 1, 2))
    labels = np.stack([hull_vertices(p) for p in xy]).astype(np.int64)
    return xy.astype(np.float32), labels


def text_tokens(text: str) -> np.ndarray:
    """Token ids of ``text`` in the BERT (uncased) vocabulary of the embedded MiniLM."""
    from transformers import AutoTokenizer

    from probe.loading import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()), trust_remote_code=False)
    tokenizer.model_max_length = len(text) + 1  # one long stream, cut into windows later
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


def read_text(path: str | Path | None) -> str:
    """The UTF-8 text of ``path``, or the built-in sample text."""
    if path is None:
        from importlib.resources import files

        return files("probe").joinpath("data", "sample.txt").read_text(encoding="utf-8")
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProbeError(f"--text {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProbeError(f"--text {path}: cannot read UTF-8 text ({exc})") from None


def memorization_data(ids: np.ndarray, n: int, tokens: int, rng: np.random.Generator):
    """(windows (n, tokens) of BERT ids, random binary labels (n, tokens)).

    Window i starts at a seeded random offset of the token stream, so a text
    shorter than n * tokens is reused; the labels are drawn per window and
    token, so repeated text still carries fresh labels to memorise.
    """
    if len(ids) < tokens:
        raise ProbeError(
            f"the text has {len(ids)} tokens; memorization needs at least {tokens} per sequence"
        )
    starts = rng.integers(0, len(ids) - tokens + 1, size=n)
    windows = np.stack([ids[s : s + tokens] for s in starts])
    labels = rng.integers(0, 2, size=(n, tokens), dtype=np.int64)
    return windows, labels


def compact_vocab(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids renumbered 0..V-1, the BERT ids they stand for): an embedding over used tokens only."""
    used, inverse = np.unique(windows, return_inverse=True)
    return inverse.reshape(windows.shape).astype(np.int64), used


def circle_points(n: int, radius: float = 0.3) -> np.ndarray:
    """(n, 2) points at angles 2 pi i / n."""
    theta = 2 * np.pi * np.arange(n) / n
    return (radius * np.stack([np.cos(theta), np.sin(theta)], axis=1)).astype(np.float32)


def circle_data(n: int, radius: float = 0.3):
    """(inputs (n/2 - 1, 2, 2), targets (n/2 - 1, 2, 2)): points i and i + n/2 - 1 -> one step on."""
    if n < 4 or n % 2:
        raise ProbeError(f"the circle needs an even number of points >= 4, got {n}")
    pts = circle_points(n, radius)
    items = n // 2 - 1
    i = np.arange(items)
    x = np.stack([pts[i], pts[i + items]], axis=1)
    y = np.stack([pts[i + 1], pts[i + 1 + items]], axis=1)
    return x, y
