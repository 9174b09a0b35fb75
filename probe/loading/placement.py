"""Spreading a model over devices with accelerate: device maps, dispatch, offloaded weights.

A model larger than one device is placed by accelerate (``device_map``): whole modules on
the GPUs, the CPU, or the disk, under ``max_memory``.  accelerate's hooks move
activations between devices and bring offloaded weights in for each forward, so the
numbers are those of the unsplit model.  Code that reads weights outside a forward holds
them in memory inside :func:`onloaded`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import weakref

import torch

from ..errors import ProbeError, one_line

DEVICE_MAPS = ("auto", "balanced", "sequential")


def check_device_map(device_map) -> None:
    """None, an explicit ``{module: device}`` map, or one of :data:`DEVICE_MAPS`."""
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
                f"cannot plan `device_map` {device_map} with `max_memory` {max_memory}: "
                f"{one_line(err)}"
            ) from None
    if placed.get("") == "disk":
        raise ProbeError(
            "`max_memory` leaves no room for any module in memory (all would go to the disk); "
            "allow more memory"
        )
    folder = private_folder(offload_folder) if "disk" in placed.values() else None
    try:
        # Without accelerate's note that offloaded weights sit on the meta device.
        hush = logging.getLogger("accelerate.big_modeling")
        level, hush.level = hush.level, logging.ERROR
        try:
            model = dispatch_model(model, device_map=placed, offload_dir=folder)
        finally:
            hush.setLevel(level)
    except BaseException as err:  # an interrupt too: nothing offloaded is left behind
        if folder is not None:
            folder.remove()
        if isinstance(err, ValueError | RuntimeError | OSError):
            raise ProbeError(
                f"cannot spread the model with `device_map`: {one_line(err)}"
            ) from None
        raise
    if folder is not None:  # read from for as long as the model lives; gone at exit anyway
        weakref.finalize(model, folder.remove)
    model.hf_device_map = placed
    return model


class OffloadFolder(str):
    """A run's private folder for offloaded weights (a ``str``: accelerate's ``offload_dir``).

    accelerate reuses whatever offloaded weights its folder already holds, so a folder
    shared between runs (or two runs at once) would run one model with another's layers.
    Each model therefore offloads into a fresh folder of its own, made by ``mkdtemp``
    inside the user's ``offload_folder`` (or the system's temporary folder), and removed
    when the model is collected or the process exits, whichever comes first, as is the
    user's folder if probe made it and it is empty then.
    """

    made_parent: str | None = None

    def remove(self) -> None:
        shutil.rmtree(self, ignore_errors=True)
        if self.made_parent is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.made_parent)  # only when empty: another run may use it


def private_folder(offload_folder=None) -> OffloadFolder:
    """A fresh :class:`OffloadFolder` inside ``offload_folder`` (created if missing)."""
    parent, made = None, None
    if offload_folder is not None:
        parent = os.path.abspath(os.fspath(offload_folder))
        try:
            if not os.path.isdir(parent):
                os.makedirs(parent)
                made = parent
            folder = OffloadFolder(tempfile.mkdtemp(prefix="probe-offload-", dir=parent))
        except OSError as err:
            raise ProbeError(
                f"cannot make a folder for offloaded weights in `offload_folder` {parent}: "
                f"{one_line(err)}"
            ) from None
    else:
        folder = OffloadFolder(tempfile.mkdtemp(prefix="probe-offload-"))
    folder.made_parent = made
    return folder


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
