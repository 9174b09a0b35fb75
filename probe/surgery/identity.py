"""One identity of the self-test on one model (:mod:`probe.surgery.self_test`): how far its
two sides are apart, relative to what, and what allowance verification gives it."""

from __future__ import annotations

from dataclasses import dataclass

#: verify()'s allowance, in units of the dtype's machine epsilon times the values' scale.
ULPS = 64


@dataclass(frozen=True)
class Identity:
    """One identity on one model: how far its two sides are apart, and relative to what."""

    name: str
    max_diff: float
    scale: float
    detail: str = ""
    error: str = ""
    #: The entry's field a failure points at (what to fix in ``families.py``).
    field: str = "steps"
    #: An absolute allowance of its own, where the two sides are different arithmetic (the
    #: path decomposition's float64 programme against a run with float32 norms).
    bound: float = 0.0

    def holds(self, tolerance: float = 0.0) -> bool:
        allowed = max(tolerance * max(self.scale, 1e-30), self.bound)
        return not self.error and self.max_diff <= allowed
