"""The one check for a forward pass that overflowed, shared by every analysis.

The weights are checked finite at load (``probe.loading``), so NaN or inf in what a layer
gives (its token representations, its attention probabilities) means the forward pass
overflowed in the run's dtype.  Every analysis stops such a run at that layer, before any
statistic sees the values, with one line: the model and its init (and variant, where a run
has several), the layer, the dtype, and what to change, which depends on that dtype: a
wider one where there is one (float16: float32 or float64; bfloat16, whose range is
float32's, and float32: float64), a smaller branch scale where one is set, and for a
float64 run without one, smaller weights.  Padding is not looked at: it may hold anything.
"""

from __future__ import annotations

import torch

from .errors import ProbeError

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
    # One pass over the whole tensor first (no copy); only a tensor holding a non-finite
    # value somewhere has its real entries picked out.
    if bool(torch.isfinite(x).all()):
        return
    bad = ~torch.isfinite(x)
    if bad.dim() > mask.dim():
        bad = bad.flatten(mask.dim()).any(-1)
    if bool((bad & mask.bool()).any()):
        dtype = str(x.dtype).removeprefix("torch.")
        raise ProbeError(
            f"{where + ': ' if where else ''}layer {layer}'s {what} hold NaN or inf: the "
            f"forward pass overflowed in {dtype}; {overflow_advice(x.dtype, scaled)}"
        )
