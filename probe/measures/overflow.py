"""The one check for a forward pass that overflowed, shared by every analysis.

The weights are checked finite at load (``probe.loading``), so NaN or inf in what a layer
gives (its token representations, its attention probabilities) means the forward pass
overflowed in the run's dtype.  Every analysis stops such a run at that layer, before any
statistic sees the values, with one line: the model and its init (and variant, where a run
has several), the layer, the dtype, and what to change, which depends on that dtype: a
wider one where there is one (float16: float32 or float64; bfloat16, whose range is
float32's, and float32: float64), a smaller branch scale where one is set, and for a
float64 run without one, smaller weights.  Padding is not looked at: it may hold anything.

Beside it, :func:`check_nonzero` stops a run whose representations are finite but hold
nothing to measure: a sequence whose real tokens are all exactly zero at a layer.  Every
ratio of the collapse metrics and of the path decomposition is then 0/0, and an attention
that reads such a layer sees no token at all; no trained model gives one, so the line says
the weights are degenerate.  A single zero token among others is measurable: the metrics
count its cosine with any token as 0 (``probe.measures.metrics``, ``probe.measures.attention_stats``).
"""

from __future__ import annotations

import torch

from probe.errors import NothingToMeasure

#: The dtypes with a wider range to suggest, as the library's `dtype` names them.
WIDER = {
    torch.float16: "float32 or float64",
    torch.bfloat16: "float64",
    torch.float32: "float64",
}


def overflow_advice(dtype: torch.dtype, scaled: bool = False) -> str:
    """What to change after an overflow in ``dtype`` (``scaled``: a branch scale is set)."""
    wider = WIDER.get(dtype)
    if wider is not None:
        return f"use `dtype` {wider}" + (", or a smaller `branch_scale`" if scaled else "")
    if scaled:
        return "use a smaller `branch_scale`"
    return "use smaller weights (a smaller initializer_range through `config`)"


def check_finite(
    x: torch.Tensor,
    mask: torch.Tensor,
    layer: int,
    where: str = "",
    what: str = "token representations",
    scaled: bool = False,
) -> None:
    """Raise the overflow line (module docstring) where a real entry of ``x`` is NaN or inf.

    ``mask`` (1 or True at real entries) covers x's leading dims, or broadcasts to them: a
    (sequence, token) mask for (sequence, token, hidden) representations, a (sequence, 1,
    query, key) one for (sequence, head, query, key) probabilities.  ``layer`` is named as
    the result's ``layer`` dim counts (0 = the embeddings' output), ``where`` prefixes the
    line (the model, init, variant), ``what`` names the values, ``scaled``: a branch scale
    is set (``overflow_advice``)."""
    # One pass over the whole tensor first, a sum (no copy, no mask): it is finite only if
    # every entry is (NaN and inf carry through any sum), so only a tensor whose sum is not
    # finite, a non-finite entry somewhere or finite entries summing past the dtype's range,
    # has its entries looked at, and then its real entries picked out.
    if bool(torch.isfinite(x.sum())) or bool(torch.isfinite(x).all()):
        return
    bad = ~torch.isfinite(x)
    if bad.dim() > mask.dim():
        bad = bad.flatten(mask.dim()).any(-1)
    if bool((bad & mask.bool()).any()):
        dtype = str(x.dtype).removeprefix("torch.")
        raise NothingToMeasure(
            f"{where + ': ' if where else ''}layer {layer}'s {what} hold NaN or inf: the "
            f"forward pass overflowed in {dtype}; {overflow_advice(x.dtype, scaled)}"
        )


#: What a layer with nothing to measure means, and what to do, as every analysis says it.
DEGENERATE = (
    "the model's weights are degenerate; use other weights (trained ones, or at random init "
    "a larger initializer_range through `config`)"
)
#: What an all-zero layer means for the statistics of most analyses.
ZERO_RATIOS = "every ratio measured on it is 0/0"


def has_zero_sequence(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Whether some sequence of ``x`` is all zero at its real tokens.

    Parameters
    ----------
    x
        (sequence, token, hidden) representations, any dtype and device.
    mask
        (sequence, token), 1 or True at real tokens; a sequence without one is not counted.

    Returns
    -------
    torch.Tensor
        A 0-dim bool tensor on x's device, not yet read (no wait).  A NaN is not zero.
    """
    # The largest |entry| of each token, in one reduction over x.
    peak = torch.linalg.vector_norm(x, float("inf"), dim=-1)
    real = mask.to(peak.device).bool()  # a layer a device map put on another device
    return (((peak == 0) | ~real).all(-1) & real.any(-1)).any()


def check_nonzero(
    x: torch.Tensor,
    mask: torch.Tensor,
    layer: int,
    where: str = "",
    what: str = "token representations",
    why: str = ZERO_RATIOS,
) -> None:
    """Stop a run at a layer whose real tokens are all exactly zero in some sequence.

    No trained model gives one: every ratio measured on such a sequence is 0/0, and an
    attention that reads it sees no token.  Run it after ``check_finite``.

    Parameters
    ----------
    x
        (sequence, token, hidden) representations.
    mask
        (sequence, token), 1 or True at real tokens.
    layer
        The layer, as the result's ``layer`` dim counts it (0 = the embeddings' output).
    where
        What the line starts with: the model, init and variant.
    what
        What ``x`` holds, in words.
    why
        What such a layer does to the analysis, in words.

    Raises
    ------
    ProbeError
        One line naming ``where``, the layer, ``why`` and that the weights are degenerate.
    """
    if bool(has_zero_sequence(x, mask)):
        raise NothingToMeasure(
            f"{where + ': ' if where else ''}layer {layer}'s {what} are all zero in a whole "
            f"sequence, so {why}: {DEGENERATE}"
        )
