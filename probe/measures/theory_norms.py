"""The norms the paper's bounds are stated in (Dong, Cordonnier & Loukas 2021).

||A||_1 is the largest absolute column sum, ||A||_inf the largest absolute row sum, and the
paper's composite norm ||A||_{1,inf} = sqrt(||A||_1 ||A||_inf): of the weights, for the
constants of ``probe.measures.theory``, and of the residual res(X) = X - 1 x^T of hidden states
(the token-mean fit), which the bounds start from and are compared with.  ``probe.measures.theory``
re-exports them.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def norm_1(a: torch.Tensor) -> float:
    """||A||_1: the largest absolute column sum.

    Parameters
    ----------
    a
        A 2-D matrix.

    Returns
    -------
    float
    """
    return float(a.abs().sum(0).max())


def norm_inf(a: torch.Tensor) -> float:
    """||A||_inf: the largest absolute row sum.

    Parameters
    ----------
    a
        A 2-D matrix.

    Returns
    -------
    float
    """
    return float(a.abs().sum(1).max())


def norms_1_inf(a: torch.Tensor) -> torch.Tensor:
    """(||A||_1, ||A||_inf) as a tensor of two on A's device."""
    magnitude = a.abs()
    return torch.stack([magnitude.sum(0).max(), magnitude.sum(1).max()])


def composite(one: float, inf: float) -> float:
    """sqrt(||A||_1 ||A||_inf) from the two norms."""
    return math.sqrt(one * inf)


def norm_1inf(a: torch.Tensor) -> float:
    """The paper's composite ||A||_{1,inf} = sqrt(||A||_1 ||A||_inf).

    Parameters
    ----------
    a
        A 2-D matrix.

    Returns
    -------
    float
    """
    return composite(*norms_1_inf(a).tolist())


def residual_norms(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """||res(X)||_{1,inf} per sequence (the token-mean fit, real tokens only).

    Padded rows are zeroed: they add nothing to a column sum, and their row sum of 0 is never
    the largest.

    Parameters
    ----------
    x
        (sequence, token, hidden) hidden states.
    mask
        (sequence, token), nonzero at real tokens.

    Returns
    -------
    Tensor
        float64, (sequence,), on x's device (no wait for it: the collapse run takes it inside
        its layer loop).  NaN for a sequence without real tokens.
    """
    real = mask.to(torch.float64).unsqueeze(-1)  # (sequence, token, 1)
    x = x.to(torch.float64)
    mean = (x * real).sum(1, keepdim=True) / real.sum(1, keepdim=True)
    res = ((x - mean) * real).abs()
    return (res.sum(1).amax(-1) * res.sum(2).amax(-1)).sqrt()


def residual_norm(x: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """[`residual_norms`][probe.measures.theory.residual_norms] as a NumPy array.

    Parameters
    ----------
    x
        (sequence, token, hidden) hidden states.
    mask
        (sequence, token), nonzero at real tokens.

    Returns
    -------
    numpy.ndarray
        float64, (sequence,).
    """
    return residual_norms(x, mask).cpu().numpy()
