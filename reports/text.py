"""The generated paragraph: the figure's story in words, from `probe.measures.stats.summarise`.

Plain text out; the caller escapes it (variant and init names come from the
data). One sentence per init, variants in the order of the figure's legend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from probe.measures.stats import ordered
from probe.names import INITS, VARIANTS


def duration(seconds: object) -> str:
    """A wall time as a person reads it: "7.7 s", "41 s", "3 min 5 s", "17 min", "2 h 4 min" ("?"
    where `seconds` is not a finite number)."""
    try:
        total = float(seconds)
    except (TypeError, ValueError):
        return "?"
    if not math.isfinite(total):
        return "?"
    if total < 60:
        return f"{total:.1f} s" if total < 10 else f"{total:.0f} s"
    whole = round(total)
    if whole < 600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 3600:
        return f"{round(total / 60)} min"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def threshold_text(value: float) -> str:
    """1e-3 rather than 0.001: thresholds are read as orders of magnitude."""
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _name(variant: str) -> str:
    return "the transformer variant" if variant == "transformer" else variant


def _clause(variant: str, numbers: Mapping[str, object], threshold: str) -> str:
    if numbers["first_below"] is not None:
        text = f"{_name(variant)} falls under {threshold} at layer {numbers['first_below']}"
    else:
        text = f"{_name(variant)} stays above {threshold} and ends at {numbers['final_text']}"
    if numbers["order"] is not None:
        text += f" (fitted order {numbers['order']:.2f}, {numbers['order_note']})"
    return text


EXPLANATION = (
    "A fitted order near 3 is the cubic per-layer contraction behind the paper's "
    "doubly exponential rank collapse; near 1 is plain exponential decay."
)


def paragraph(
    summary: Mapping[str, Mapping[str, Mapping]], threshold: float = 1e-3, explain: bool = True
) -> str:
    """E.g. "At random init, SAN falls under 1e-3 at layer 3 (fitted order 2.83); ...".

    `explain` appends what the fitted order means (once per page is enough).
    """
    limit = threshold_text(threshold)
    variants = ordered(summary, VARIANTS)
    inits = ordered(dict.fromkeys(i for v in summary.values() for i in v), INITS)
    sentences = []
    for init in inits:
        clauses = [
            _clause(variant, summary[variant][init], limit)
            for variant in variants
            if init in summary[variant]
        ]
        sentences.append(f"At {init} init, {'; '.join(clauses)}.")
    if not sentences:
        return "No variant has data."
    return " ".join(sentences + ([EXPLANATION] if explain else []))
