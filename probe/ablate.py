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

=============  =========  =====
variant        attn skip  MLP
=============  =========  =====
SAN            no         no
SAN+MLP        no         yes
SAN+skip       yes        no
transformer    yes        yes
=============  =========  =====
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import names
from .errors import ProbeError


@dataclass(frozen=True)
class Ablation:
    """Which sublayers a run keeps; ``Ablation()`` is the unablated model."""

    attn_skip: bool = True
    mlp: bool = True
    #: ``"probe"``: the uniform definitions above; ``"paper"``: per family, the surgery
    #: the paper's code applied (each adapter's table says where the two differ).
    surgery: str = "probe"

    def __post_init__(self) -> None:
        if self.surgery not in names.SURGERIES:
            raise ProbeError(
                f"unknown surgery {self.surgery!r}; choose {' or '.join(names.SURGERIES)}"
            )

    @property
    def name(self) -> str:
        """The paper's name for this combination (``SAN``, ``SAN+MLP``, ...)."""
        for name, preset in PRESETS.items():
            if (preset.attn_skip, preset.mlp) == (self.attn_skip, self.mlp):
                return name
        raise AssertionError("every combination of two flags has a preset")

    def with_surgery(self, surgery: str) -> Ablation:
        """The same variant under another definition (``"probe"`` or ``"paper"``)."""
        return replace(self, surgery=surgery)

    @property
    def is_identity(self) -> bool:
        return self.attn_skip and self.mlp


SAN = Ablation(attn_skip=False, mlp=False)
SAN_MLP = Ablation(attn_skip=False, mlp=True)
SAN_SKIP = Ablation(attn_skip=True, mlp=False)
TRANSFORMER = Ablation()

#: The paper's variants, named and ordered as in probe.names.VARIANTS.
PRESETS: dict[str, Ablation] = dict(
    zip(names.VARIANTS, (SAN, SAN_MLP, SAN_SKIP, TRANSFORMER), strict=True)
)
VARIANTS: tuple[str, ...] = names.VARIANTS


def parse_variants(spec: str) -> list[str]:
    """``"all"`` or a comma list of variant names -> names in canonical order."""
    if spec.strip().lower() == "all":
        return list(VARIANTS)
    wanted = [part.strip() for part in spec.split(",") if part.strip()]
    lookup = {name.lower(): name for name in VARIANTS}
    unknown = [name for name in wanted if name.lower() not in lookup]
    if unknown or not wanted:
        raise ProbeError(
            f"unknown variant {', '.join(unknown) or repr(spec)}; "
            f"choose 'all' or a comma list of {', '.join(VARIANTS)}"
        )
    chosen = {lookup[name.lower()] for name in wanted}
    return [name for name in VARIANTS if name in chosen]


def variant_from_flags(no_skip: bool, no_mlp: bool) -> str:
    """The one variant that ``--no-skip`` / ``--no-mlp`` select."""
    return Ablation(attn_skip=not no_skip, mlp=not no_mlp).name
