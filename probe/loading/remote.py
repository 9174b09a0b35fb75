"""A model run by NDIF through nnsight's remote backend, or nnsight's local simulation of it.

Nothing but the config and the tokenizer is loaded here for NDIF: nnsight builds the
hosted language model on the meta device and every trace runs on the server.
"""

from __future__ import annotations

import torch

from probe.loading.quiet import quiet

from ..errors import ProbeError, one_line
from .hub import host_reachable, hub_reachable
from .model import ProbedModel
from .options import as_dtype


def remote_model(
    name, location, where, config, adapter, init, remote, dtype, device_map
) -> ProbedModel:
    """A model hosted by NDIF (``remote=True``) or its local simulation (``"local"``).

    NDIF serves pretrained checkpoints as nnsight ``TransformersModel`` wrappers of the
    whole language model (head included), in bfloat16.  probe wraps the same class around
    the same checkpoint: for ``True`` on the meta device (the weights stay on the server),
    for ``"local"`` with its weights here.  The family walker then starts from the base
    model inside it (``root.<base_model_prefix>``, GPT-2's ``transformer``), and every
    metric is reduced inside the trace, so only per-layer, per-sequence numbers travel back.
    """
    _check_settings(remote, init, device_map)
    task = _task_of(name, config)
    if remote is True:
        _check_ndif()
    hosted = _hosted(name, location, task, remote, dtype)
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


def _check_settings(remote, init: str, device_map) -> None:
    if remote not in (True, "local"):
        raise ProbeError(f"remote is True (NDIF) or 'local' (its simulation), got {remote!r}")
    if init != "pretrained":
        raise ProbeError("the remote service runs pretrained weights only; use `init` pretrained")
    if device_map is not None:
        raise ProbeError("`remote` runs on the service's devices; drop `device_map`")


def _task_of(name, config) -> str:
    """The transformers task of a causal or masked language model checkpoint, from its
    config's architectures; refused for any other."""
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
            f"(architectures {architectures or 'unknown'}); `remote` runs the models NDIF hosts"
        )
    return task


def _check_ndif() -> None:
    """Refuse NDIF where it or the hub cannot be reached, or without an API key."""
    from nnsight import CONFIG

    if not hub_reachable() or not host_reachable(CONFIG.API.HOST):
        raise ProbeError(
            f"`remote` needs the network: {CONFIG.API.HOST} (NDIF) or the HuggingFace hub "
            "cannot be reached; run locally, or connect"
        )
    if not CONFIG.API.APIKEY:
        raise ProbeError(
            "`remote` needs an NDIF API key: set NDIF_API_KEY (get one at "
            "https://login.ndif.us), or nnsight's CONFIG.set_default_api_key"
        )


def _hosted(name, location, task: str, remote, dtype):
    """nnsight's wrapper of the whole language model: on the meta device for NDIF, with its
    weights here for the local simulation."""
    from nnsight.modeling.transformers import TransformersModel

    # NDIF serves bfloat16 only; the local simulation runs the dtype asked for.
    torch_dtype = torch.bfloat16 if remote is True else as_dtype(dtype)
    try:
        with quiet():
            return TransformersModel(
                str(location),
                task=task,
                dispatch=remote == "local",
                dtype=torch_dtype,
                attn_implementation="eager",
            )
    except Exception as err:
        raise ProbeError(f"cannot load {name} for `remote`: {one_line(err)}") from None
