"""The words probe uses everywhere, defined once.

Dims, CLI option values, plot labels, report headings and file names all take
their vocabulary from here, in this order.  The module imports nothing, so the
command line can build its choices from it without loading torch.
"""

from __future__ import annotations

#: The paper's four networks, in the order of its figures (Dong et al. 2021, Fig. 2).
VARIANTS: tuple[str, ...] = ("SAN", "SAN+MLP", "SAN+skip", "transformer")
#: The fifth and sixth variants (``--no-layernorm``; the paper's Section 3.3 asks what the
#: norms do): the transformer with every norm inside its layers reduced to its affine map
#: (normalisation removed, scale and shift kept), and with those norms removed entirely.
NORM_VARIANTS: tuple[str, ...] = ("LN-affine", "no-LN")
#: The same two on the paper's other networks: ``SAN/no-LN`` is pure attention, no norm at
#: all (Wu et al. 2024), ``SAN+skip/LN-affine`` attention and skips with the norms' affine
#: maps; one name each, so a result's ``variant`` dimension selects them.
COMPOSED_NORM_VARIANTS: tuple[str, ...] = tuple(
    f"{variant}/{norm}" for variant in VARIANTS[:3] for norm in NORM_VARIANTS
)
#: The seventh and eighth variants: the transformer with the attention to its sink
#: keys removed, and with its massive activations replaced by their corpus mean, both found in
#: a clean run of the same model and inputs first (``probe.surgery.removals``).
REMOVAL_VARIANTS: tuple[str, ...] = ("no-sink", "no-massive")
#: What each removal variant removes (``Ablation.remove``): nothing, the sinks, the massive entries.
REMOVALS: tuple[str, ...] = ("", "sinks", "massive")
#: What each norm variant does to a norm: ``kept`` (the paper's four), ``affine``, ``removed``.
NORM_MODES: tuple[str, ...] = ("kept", "affine", "removed")
#: Weights a model is probed with; pretrained first everywhere (it loads first, so
#: weights that cannot be had stop a run before any work).
INITS: tuple[str, ...] = ("pretrained", "random")
#: Per-layer, per-sequence quantities of a collapse result, the main one first.
METRICS: tuple[str, ...] = (
    "relative_residual",
    "effective_rank",
    "stable_rank",
    "cosine_similarity",
)
#: Wu et al. (2024)'s distance to rank one, mu(X) = ||X - 1 gamma_X^T||_F with gamma_X the
#: token mean, in the hidden states' own units: the relative residual's numerator at fit
#: ``mean`` and norm ``fro``, measured with it and stored beside it in a collapse result.
MU = "mu"


def stored(metrics: tuple[str, ...]) -> tuple[str, ...]:
    """The per-sequence variables a run that measures ``metrics`` stores: ``mu`` beside the
    relative residual."""
    if "relative_residual" not in metrics:
        return metrics
    return ("relative_residual", MU, *(m for m in metrics if m != "relative_residual"))


#: Metrics with neither norm nor fit.
PLAIN_METRICS: tuple[str, ...] = METRICS[1:]
#: Matrix norms of the relative residual; l1inf is the paper's composite norm.
NORMS: tuple[str, ...] = ("l1inf", "fro", "spectral", "l1", "linf")
#: What the residual is taken against: the token mean (the paper's notebook) or the best rank-one fit.
FITS: tuple[str, ...] = ("mean", "svd")
#: Precisions a model can run in (metrics are always computed in float64).
DTYPES: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")
#: Ablation definitions: probe's, uniform across families, or the paper's own code's per family.
SURGERIES: tuple[str, ...] = ("probe", "paper")
#: How the effective rank is computed: from the full spectrum, by a matmul-only estimate, or
#: whichever costs less at the size and device (probe.measures.metrics explains both).
EFFECTIVE_RANK_METHODS: tuple[str, ...] = ("auto", "exact", "estimate")
#: Models ``probe fastformer train --baseline`` trains beside the Fastformer.
BASELINES: tuple[str, ...] = ("gpt2",)
#: Setups of the circle experiment: the paper's definitions, or probe's stricter skip-free ones.
TOY_SETUPS: tuple[str, ...] = ("paper", "strict")
#: Where a path's attention comes from in path-restricted evaluation: its own state (the
#: paper's) or the full model's forward.
PATH_ATTENTIONS: tuple[str, ...] = ("own", "full")
#: How a path normalises: plain LayerNorms plus one on the sum (the paper's) or the trained ones.
PATH_NORMS: tuple[str, ...] = ("paper", "trained")
#: Learning-rate schedules of the toy training: constant, the paper's convex-hull steps
#: (x0.91 after epochs 15, 30, 40, 50, 60) and its memorization linear decay to 0.
SCHEDULES: tuple[str, ...] = ("constant", "steps", "linear")
#: Multiplication orders of the attention product along a path: the paper's notebook puts the
#: earliest layer on the left, P = A_{l_1} ... A_{l_d}; the map a path applies to the tokens
#: puts the latest layer on the left, P = A_{l_d} ... A_{l_1} (the paper's Section 2.2).
ORDERS: tuple[str, ...] = ("earliest-left", "latest-left")
