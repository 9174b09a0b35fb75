"""Attention paths: the vocabulary shared by every path analysis.

With skip connections, an L-layer self-attention network with H heads per layer
unrolls into a sum of paths (Dong, Cordonnier & Loukas 2021, Section 2.2): at
every layer a path goes either through the skip connection or through one head.
There are (H+1)^L paths; the *length* of a path is the number of heads it goes
through, and C(L, k) H^k paths have length k (0 <= k <= L).

A path is a tuple with one entry per layer, first layer first::

    (SKIP, 3, SKIP, 0)      # L = 4: skip, head 3, skip, head 0; length 2

``SKIP`` is ``None``; a head is its index 0..H-1.  As text (CLI options, Dataset
coordinates) the same path is ``"s.3.s.0"``.  The attention product along a
path, as the map it applies to the tokens, puts the latest layer on the left:
P = A_{l_k} ... A_{l_1} (the paper's Section 2.2); the paper's notebook multiplies
the other way, A_{l_1} ... A_{l_k}, and ``paths.sample`` (probe.analyses) measures both.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence

SKIP = None
Path = tuple[int | None, ...]

#: The largest L and H whose exact counts probe computes and writes: (H+1)^L has
#: L log10(H+1) digits (3,000 at 1000 x 1000, against 8 for bert-base); deeper or wider
#: counts run to millions of digits per length.  Real models stay far below (GPT-3: 96 x 96).
MAX_SHAPE = 1000


def path_length(path: Sequence[int | None]) -> int:
    """Number of heads a path goes through (skips do not count)."""
    return sum(step is not SKIP for step in path)


def count_by_length(layers: int, heads: int) -> list[int]:
    """Exact number of paths of each length k = 0..L: C(L, k) H^k (Python ints)."""
    _check_shape(layers, heads)
    return [math.comb(layers, k) * heads**k for k in range(layers + 1)]


def total_paths(layers: int, heads: int) -> int:
    """(H+1)^L, the number of all paths."""
    _check_shape(layers, heads)
    return (heads + 1) ** layers


def all_paths(layers: int, heads: int) -> Iterator[Path]:
    """Every path, in lexicographic order with SKIP first (feasible only for tiny L, H)."""
    _check_shape(layers, heads)
    return itertools.product((SKIP, *range(heads)), repeat=layers)


def random_path(layers: int, heads: int, length: int, rng: random.Random) -> Path:
    """A path of the given length, uniform over the C(L, k) H^k such paths."""
    _check_shape(layers, heads)
    if not 0 <= length <= layers:
        raise ValueError(f"path length must be in 0..{layers}, got {length}")
    chosen = set(rng.sample(range(layers), length))
    return tuple(rng.randrange(heads) if layer in chosen else SKIP for layer in range(layers))


def random_paths(layers: int, heads: int, length: int, n: int, seed: int) -> list[Path]:
    """``n`` independent uniform paths of one length, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [random_path(layers, heads, length, rng) for _ in range(n)]


def path_str(path: Sequence[int | None]) -> str:
    """``(None, 3, None, 0)`` -> ``"s.3.s.0"``."""
    return ".".join("s" if step is SKIP else str(step) for step in path)


def parse_path(text: str, heads: int | None = None) -> Path:
    """Inverse of :func:`path_str`; ``heads`` bounds the head indices when given."""
    steps: list[int | None] = []
    for part in text.strip().split("."):
        if part == "s":
            steps.append(SKIP)
        elif part.isdigit() and (heads is None or int(part) < heads):
            steps.append(int(part))
        else:
            bound = f"0..{heads - 1}" if heads else "a head index"
            raise ValueError(f"bad path {text!r}: each step is 's' (skip) or {bound}")
    return tuple(steps)


def _check_shape(layers: int, heads: int) -> None:
    if layers < 0 or heads < 1:
        raise ValueError(f"need layers >= 0 and heads >= 1, got L={layers}, H={heads}")
