"""probe: what keeps self-attention from collapsing to rank one?

Reproduces and extends Dong, Cordonnier & Loukas, *Attention is not all you
need: pure attention loses rank doubly exponentially with depth* (ICML 2021)
on stock HuggingFace models, with nnsight hooks instead of patched model code.

    >>> import probe
    >>> from probe.analyses import collapse
    >>> ds = collapse.run("minilm", init="pretrained")
    >>> probe.save_result(ds, "minilm.nc")

The names below are imported on first use (PEP 562), so that the ``probe``
command starts without loading torch; ``ds.probe`` is registered as soon as
results are saved, opened or computed.  ``import probe`` registers the Fastformer
family with transformers' Auto classes (the command does it when it loads a model).
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

from .errors import ProbeError

try:
    __version__ = metadata.version("probe")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

#: public name -> the submodule that defines it (None: the name is the submodule).
_LAZY = {
    "PRESETS": "surgery.ablate",
    "SAN": "surgery.ablate",
    "SAN_MLP": "surgery.ablate",
    "SAN_SKIP": "surgery.ablate",
    "TRANSFORMER": "surgery.ablate",
    "LN_AFFINE": "surgery.ablate",
    "NO_LN": "surgery.ablate",
    "VARIANTS": "surgery.ablate",
    "Ablation": "surgery.ablate",
    "Model": "requests.request",
    "Inputs": "requests.request",
    "ProbedModel": "loading",
    "load": "loading",
    "wrap": "loading",
    "open_result": "files.results",
    "save_result": "files.results",
    "hidden_states": "surgery.trace",
    "layer_values": "surgery.trace",
    "attention": "analyses.attention",
    "names": None,
    "fastformer": None,
    "loading": None,
}

#: Modules a notebook reaches as ``probe.<name>``, from the folder that holds them:
#: ``probe.paths`` is the path analyses (``probe.paths.count``, ``.sample``, ``.decompose``),
#: as ``probe.attention`` is the attention analysis; the paths' vocabulary is
#: :mod:`probe.measures.path_vocabulary`.
_MODULES = {
    "paths": "analyses.paths",
    "accessor": "files.accessor",
    "metrics": "measures.metrics",
    "theory": "measures.theory",
    "plot": "figures.plot",
    "stats": "measures.stats",
}

__all__ = ["ProbeError", "__version__", *_LAZY, *_MODULES]


def __getattr__(name: str):
    if name in _MODULES:
        value = importlib.import_module(f".{_MODULES[name]}", __name__)
        globals()[name] = value
        return value
    if name not in _LAZY:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))


def _is_the_cli() -> bool:
    """The ``probe`` command registers the Fastformer when it loads a model (probe.load)."""
    return bool(sys.argv) and sys.argv[0].rsplit("/", 1)[-1].removesuffix(".exe") == "probe"


if not _is_the_cli():
    # FastformerForCausalLM with AutoConfig / AutoModel / AutoModelForCausalLM, so that
    # `import probe` is all a notebook needs before `AutoModelForCausalLM.from_pretrained`.
    from probe import fastformer  # noqa: E402,F401
