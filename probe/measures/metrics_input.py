"""The input of the collapse metrics: a batch checked, in float64, its padding zeroed.

``probe.measures.metrics`` states the conventions this module holds: X is (sequence, token, hidden) of
any real dtype and device and ``mask`` a bool (sequence, token) tensor of its real tokens;
padded tokens, whatever they hold (NaN included), become zero rows; every sequence needs 2
real tokens and real tokens must be finite.  Besides the checks: the rescaling by powers of
two that keeps squares clear of float64's range, and the token mean and mean residual
R = X - 1 mean^T every fit starts from.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probe.linalg.workspace import workspace

_F64 = torch.float64
# Sequences whose largest entry lies within 2^+-_SAFE_EXPONENT need no rescaling: squares and
# sums of squares of up to 2^100 entries stay far from float64 under- and overflow.
_SAFE_EXPONENT = 256


def check_name(name: str, valid: tuple[str, ...], what: str) -> None:
    """Raise ValueError unless ``name`` is one of ``valid`` (``what`` names the kind)."""
    if name not in valid:
        raise ValueError(f"unknown {what} {name!r}; valid {what}s: {', '.join(valid)}")


def check_shapes(X: Tensor, mask: Tensor | None) -> Tensor:
    """Check X's shape and dtype and the mask's; return the mask on X's device (None: all
    tokens real)."""
    if X.ndim != 3:
        raise ValueError(
            f"X must be a 3-D tensor (sequence, token, hidden), got shape {tuple(X.shape)}"
        )
    if X.is_complex():
        raise ValueError(f"X must be real, got dtype {X.dtype}")
    if X.shape[-1] == 0:
        raise ValueError("X must have at least one hidden feature")
    if mask is None:
        return torch.ones(X.shape[:2], dtype=torch.bool, device=X.device)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if mask.shape != X.shape[:2]:
        raise ValueError(
            f"mask must have shape (sequence, token) = {tuple(X.shape[:2])}, "
            f"got {tuple(mask.shape)}"
        )
    return mask.to(X.device)


def prepare(X: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate; return X in float64 with padded rows zeroed, the mask, real-token counts and
    each sequence's largest absolute entry."""
    mask = check_shapes(X, mask)
    counts = mask.sum(-1)
    bad = torch.nonzero(counts < 2).flatten().tolist()
    if bad:
        detail = ", ".join(f"sequence {i} has {int(counts[i])}" for i in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise ValueError(f"every sequence needs at least 2 real tokens; {detail}{more}")
    if X.dtype == _F64:
        Xm = X
    else:  # converted into reused memory (never the caller's X, which stays untouched)
        Xm = workspace(X, 3)[2].copy_(X)
    if not bool(mask.all()):
        # where/masked_fill rather than multiplying by the mask: padding may hold NaN or inf.
        if Xm is X:
            Xm = torch.where(mask[..., None], Xm, 0.0)
        else:
            Xm.masked_fill_(~mask[..., None], 0.0)
    # The largest |entry| is NaN or inf exactly when some real entry is: one pass checks both.
    flat = Xm.flatten(1)  # amax and amin: two fast passes, 4x faster than an inf-norm
    peak = torch.maximum(flat.amax(-1), -flat.amin(-1))
    if not bool(torch.isfinite(peak).all()):
        raise ValueError("X has non-finite values (NaN or inf) in real (unmasked) tokens")
    return Xm, mask, counts.to(_F64), peak


def rescale(Xm: Tensor, peak: Tensor) -> tuple[Tensor, Tensor | None]:
    """Xm with each sequence divided by a power of two where its largest entry needs it, and
    those powers' exponents (float64; None where no sequence needs one and Xm is returned
    as it is)."""
    # Every metric except residual() and mu is scale-invariant.  Scaling each sequence by a
    # power of two (exact in floating point) keeps squared entries clear of float64
    # under/overflow; it is skipped when no sequence needs it, which leaves every result bit
    # for bit the same.
    _, exponent = torch.frexp(peak)
    if bool((exponent.abs() <= _SAFE_EXPONENT).all()):
        return Xm, None
    exponent = exponent.clamp(min=-1021).to(_F64)
    return torch.ldexp(Xm, -exponent[:, None, None]), exponent


def token_mean(Xm: Tensor, counts: Tensor) -> Tensor:
    """The mean of each sequence's real tokens (padded rows zeroed by ``prepare``)."""
    return Xm.sum(-2) / counts[:, None]  # (sequence, hidden); padded rows are zero


def mean_residual(
    Xm: Tensor, mask: Tensor, counts: Tensor, out: Tensor | None = None, mean: Tensor | None = None
) -> Tensor:
    """R = X - 1 mean^T over the real tokens, into ``out`` where given."""
    mean = token_mean(Xm, counts) if mean is None else mean
    # Xm - m mean^T in one fused broadcasting pass; padded rows are 0 - 0 * mean = 0.
    return torch.addcmul(Xm, mask.to(_F64)[:, :, None], mean[:, None, :], value=-1.0, out=out)
