"""probe: what keeps self-attention from collapsing to rank one?

Reproduces and extends Dong, Cordonnier & Loukas, *Attention is not all you
need: pure attention loses rank doubly exponentially with depth* (ICML 2021)
on stock HuggingFace models, with nnsight hooks instead of patched model code.

    >>> import probe
    >>> from probe.analyses import collapse
    >>> ds = collapse.run("minilm", init="pretrained")
    >>> probe.save_result(ds, "minilm.nc")
"""

from importlib import metadata

from . import accessor, fastformer, metrics, plot
from .ablate import PRESETS, SAN, SAN_MLP, SAN_SKIP, TRANSFORMER, VARIANTS, Ablation
from .errors import ProbeError
from .load import ProbedModel, load, wrap
from .results import open_result, save_result
from .trace import hidden_states, layer_values

try:
    __version__ = metadata.version("probe")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "PRESETS",
    "SAN",
    "SAN_MLP",
    "SAN_SKIP",
    "TRANSFORMER",
    "VARIANTS",
    "Ablation",
    "ProbeError",
    "ProbedModel",
    "hidden_states",
    "layer_values",
    "load",
    "accessor",
    "fastformer",
    "metrics",
    "plot",
    "open_result",
    "save_result",
    "wrap",
]
