"""Ablations: small frozen values kept apart from the model.

An :class:`Ablation` says which parts of every transformer layer to remove.  It
is applied only inside an nnsight trace, by the family adapter
(``probe/models/<family>.py``), so the model object itself is never changed and a
clean run after an ablated one gives the numbers of a fresh model.

The definitions are the same for every family:

* ``attn_skip=False`` ("no skip") drops the identity term of the attention
  sublayer's residual sum and keeps everything else (norms, projections);
* ``mlp=False`` ("no MLP") makes the layer's output equal to its attention
  sublayer's output: the MLP, its residual and its norm are all removed.

``surgery="paper"`` asks instead for the surgery the paper's own code applied,
family by family, so that its curves can be reproduced.  It differs from
probe's definition only for ALBERT's "no MLP" (see ``probe/models/albert.py``);
for the families the paper did not probe (GPT-2) it is probe's definition.

The paper's four networks are the named presets (Dong et al. 2021, Fig. 2):

=============  =========  =====  ==========================
variant        attn skip  MLP    norms inside the layers
=============  =========  =====  ==========================
SAN            no         no     kept
SAN+MLP        no         yes    kept
SAN+skip       yes        no     kept
transformer    yes        yes    kept
LN-affine      yes        yes    affine: N(x) -> gamma x + beta
no-LN          yes        yes    removed: N(x) -> x
=============  =========  =====  ==========================

The last two (``names.NORM_VARIANTS``) measure what the paper's Section 3.3 says about
LayerNorm.  "Normalisation removed, affine kept" replaces a LayerNorm
(x - mean) / sigma * gamma + beta by gamma * x + beta, an RMSNorm x / rms * w by
w * x (Gemma's (1 + w) * x): the division by 1.  "Removed" makes every norm the
identity.  They apply to each norm module inside a transformer layer (not the
embedding's LayerNorm, not a final norm after the last layer, not the query/key
norms of Qwen3-style attention, which belong to the attention); ``probe/models/spec.py``
performs them as walker steps.  They compose with the paper's other three networks
(``names.COMPOSED_NORM_VARIANTS``): ``SAN/no-LN`` is pure attention with no norm at all,
the network Wu et al. (2024) prove collapses for every quasi-strongly connected mask,
and ``SAN/LN-affine``, ``SAN+MLP/no-LN``, ``SAN+skip/no-LN`` and the rest are named alike.

The last two (``names.REMOVAL_VARIANTS``) remove what trained transformers do
instead of collapsing, from the full transformer: ``no-sink`` removes, in every layer and
head, the attention to that head's sink keys (``sinks``: (layer, head, key) triples) and
renormalises each row over its other keys; ``no-massive`` replaces the massive entries of
every layer's output (``massive``: (layer, token, dim, value)) by their corpus mean.  Both
are found in a clean run first (``probe.surgery.removals``); the presets carry none, a run fills
them in with :func:`dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from probe import names
from probe.errors import ProbeError


@dataclass(frozen=True)
class Ablation:
    """Which sublayers a run keeps; `Ablation()` is the unablated model.

    Frozen and checked when built.  Applied only inside a trace, by the family adapter: the
    model object is never changed.  The paper's four variants (`SAN`, `SAN+MLP`, `SAN+skip`,
    `transformer`), the LayerNorm variants (`LN-affine`, `no-LN`) and the removal variants
    (`no-sink`, `no-massive`) are the presets of `probe.surgery.ablate.PRESETS`.

    Parameters
    ----------
    attn_skip
        Keep the identity term of the attention sublayer's residual sum.  False ("no
        skip") drops it and keeps everything else (norms, projections).
    mlp
        Keep the MLP.  False ("no MLP") makes the layer's output its attention sublayer's
        output: the MLP, its residual and its norm are all removed.
    surgery
        `"probe"`: the uniform definitions above; `"paper"`: per family, the surgery the
        paper's code applied (each adapter's table says where the two differ).
    norm
        The norms inside each layer: `kept`, `affine` (normalisation removed, scale and
        shift kept) or `removed`; only with skip and MLP kept.
    remove
        What the run removes: `""`, `"sinks"` (`no-sink`) or `"massive"` (`no-massive`);
        only from the full transformer.
    sinks
        (layer 1..L, head, key position) triples whose attention `no-sink` removes.
    massive
        (layer 1..L, token position, dim, corpus mean) of the entries `no-massive`
        replaces.
    branch_scale
        alpha of residual branch scaling (`probe.surgery.scaling`): every layer's attention and
        MLP branch is multiplied by it before its addition, y = x + alpha f(x); 1: no
        scaling.  Not with the LayerNorm variants.

    Raises
    ------
    ProbeError
        An unknown `surgery`, `norm` or `remove`; a LayerNorm or removal variant with skip
        or MLP removed, or a removal with a LayerNorm variant; a `branch_scale` that is not
        a positive finite number, or one other than 1 with a LayerNorm variant.
    """

    attn_skip: bool = True
    mlp: bool = True
    #: ``"probe"``: the uniform definitions above; ``"paper"``: per family, the surgery
    #: the paper's code applied (each adapter's table says where the two differ).
    surgery: str = "probe"
    #: The norms inside each layer: ``kept``, ``affine`` (normalisation removed, scale and
    #: shift kept) or ``removed`` (see the module docstring); only with skip and MLP kept.
    norm: str = "kept"
    #: What the run removes: ``""``, ``"sinks"`` (``no-sink``) or ``"massive"`` (``no-massive``).
    remove: str = ""
    #: (layer 1..L, head, key position) triples whose attention ``no-sink`` removes.
    sinks: tuple[tuple[int, int, int], ...] = ()
    #: (layer 1..L, token position, dim, corpus mean) of the entries ``no-massive`` replaces.
    massive: tuple[tuple[int, int, int, float], ...] = ()
    #: alpha of residual branch scaling (:mod:`probe.surgery.scaling`): every layer's attention and
    #: MLP branch is multiplied by it before its addition, y = x + alpha f(x); 1: no step.
    branch_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.surgery not in names.SURGERIES:
            raise ProbeError(
                f"unknown surgery {self.surgery!r}; choose {' or '.join(names.SURGERIES)}"
            )
        if self.norm not in names.NORM_MODES:
            raise ProbeError(
                f"unknown norm mode {self.norm!r}; choose {', '.join(names.NORM_MODES)}"
            )
        if self.remove not in names.REMOVALS:
            raise ProbeError(f"unknown removal {self.remove!r}; choose sinks or massive")
        if self.remove and not (self.attn_skip and self.mlp and self.norm == "kept"):
            raise ProbeError(
                "the removal variants (no-sink, no-massive) are of the full transformer"
            )

        scale = self.branch_scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, int | float)
            or not 0 < scale < float("inf")
        ):
            raise ProbeError(f"`branch_scale` must be a positive number, got {scale!r}")
        if scale != 1 and self.norm != "kept":
            raise ProbeError(
                "branch scaling runs with SAN, SAN+MLP, SAN+skip, transformer and the removal "
                "variants; leave LN-affine and no-LN out"
            )

    @property
    def name(self) -> str:
        """The variant's name (`SAN`, `SAN+MLP`, `SAN+skip`, `transformer`, `LN-affine`,
        `SAN/no-LN`, ...)."""
        if self.remove:
            return names.REMOVAL_VARIANTS[names.REMOVALS.index(self.remove) - 1]
        for name, preset in PRESETS.items():
            if (preset.attn_skip, preset.mlp, preset.norm) == (
                self.attn_skip,
                self.mlp,
                self.norm,
            ):
                return name
        raise AssertionError("every combination of two flags has a preset")

    def with_surgery(self, surgery: str) -> Ablation:
        """The same variant under another definition.

        Parameters
        ----------
        surgery
            `"probe"` or `"paper"` (see the class's `surgery`).

        Returns
        -------
        Ablation
            A copy with `surgery` replaced.

        Raises
        ------
        ProbeError
            An unknown `surgery`.
        """
        return replace(self, surgery=surgery)

    @property
    def is_identity(self) -> bool:
        return (
            self.attn_skip
            and self.mlp
            and self.norm == "kept"
            and not self.remove
            and self.branch_scale == 1
        )


SAN = Ablation(attn_skip=False, mlp=False)
SAN_MLP = Ablation(attn_skip=False, mlp=True)
SAN_SKIP = Ablation(attn_skip=True, mlp=False)
TRANSFORMER = Ablation()
LN_AFFINE = Ablation(norm="affine")
NO_LN = Ablation(norm="removed")
NO_SINK = Ablation(remove="sinks")
NO_MASSIVE = Ablation(remove="massive")

#: The paper's variants, named and ordered as in probe.names.VARIANTS, then the norm ones, then
#: the removal ones.
PRESETS: dict[str, Ablation] = dict(
    zip(
        names.VARIANTS + names.NORM_VARIANTS + names.REMOVAL_VARIANTS,
        (SAN, SAN_MLP, SAN_SKIP, TRANSFORMER, LN_AFFINE, NO_LN, NO_SINK, NO_MASSIVE),
        strict=True,
    )
)
#: The LayerNorm variants of SAN, SAN+MLP and SAN+skip (``SAN/no-LN``: pure attention).
PRESETS |= {
    name: replace(PRESETS[base], norm=PRESETS[norm].norm)
    for name in names.COMPOSED_NORM_VARIANTS
    for base, norm in [name.split("/")]
}
VARIANTS: tuple[str, ...] = names.VARIANTS
#: Every variant a run may name: the paper's four, the LayerNorm variants of the four and the
#: two removal variants.
ALL_VARIANTS: tuple[str, ...] = (
    names.VARIANTS + names.NORM_VARIANTS + names.COMPOSED_NORM_VARIANTS + names.REMOVAL_VARIANTS
)


def parse_variants(spec: str) -> list[str]:
    """``"all"`` (the paper's four) or a comma list of variant names -> names in canonical order."""
    if spec.strip().lower() == "all":
        return list(VARIANTS)
    wanted = [part.strip() for part in spec.split(",") if part.strip()]
    lookup = {name.lower(): name for name in ALL_VARIANTS}
    unknown = [name for name in wanted if name.lower() not in lookup]
    if unknown or not wanted:
        raise ProbeError(
            f"unknown variant {', '.join(unknown) or repr(spec)}; "
            f"choose 'all' or a comma list of {', '.join(ALL_VARIANTS)}"
        )
    chosen = {lookup[name.lower()] for name in wanted}
    return [name for name in ALL_VARIANTS if name in chosen]


def with_norms(variant: str) -> list[str]:
    """The two LayerNorm variants of one of the paper's four: `LN-affine` and `no-LN` of the
    transformer, `SAN/LN-affine` and `SAN/no-LN` of SAN, and so on."""
    return [
        norm if variant == "transformer" else f"{variant}/{norm}" for norm in names.NORM_VARIANTS
    ]


def variant_from_flags(no_skip: bool, no_mlp: bool) -> str:
    """The one variant that ``no_skip`` / ``no_mlp`` select."""
    return Ablation(attn_skip=not no_skip, mlp=not no_mlp).name
