"""Where a model's weights go: ``--device-map``, ``--max-memory``, ``--offload-folder``.

``probe collapse`` and ``probe paths --sample/--decompose`` take the same three options and
read them the same way (:func:`placement`), into the keyword arguments of ``probe.load``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from .console import fail
from .domains import Choice, OutFolder, Text, option

DEVICE_MAPS = ("auto", "balanced", "sequential")

DeviceMapOption = Annotated[
    str | None,
    option(
        "--device-map",
        domain=Choice(DEVICE_MAPS),
        help="Spread a model larger than one device over the GPUs, CPU and disk "
        "(accelerate): auto, balanced or sequential.",
    ),
]
MaxMemoryOption = Annotated[
    str | None,
    option(
        "--max-memory",
        domain=Text(),
        help="With --device-map: memory per device, e.g. 0=20GiB,cpu=60GiB (the rest "
        "goes to --offload-folder on disk).",
    ),
]
OffloadFolderOption = Annotated[
    Path | None,
    option(
        "--offload-folder",
        domain=OutFolder(),
        help="With --device-map: folder for weights offloaded to disk.",
    ),
]


def placement(device: str, device_map: str | None, max_memory: str | None, offload_folder) -> dict:
    """The ``probe.load`` keywords of the three options ({} without --device-map)."""
    if device_map is None and (max_memory is not None or offload_folder is not None):
        fail("--max-memory and --offload-folder go with --device-map")
    if device_map is None:
        return {}
    if device != "cpu":
        fail("use either --device or --device-map, not both")
    return {
        "device_map": device_map,
        "max_memory": memory(max_memory) if max_memory else None,
        "offload_folder": offload_folder,
    }


def memory(text: str) -> dict:
    """``0=20GiB,cpu=60GiB`` -> {0: "20GiB", "cpu": "60GiB"} (accelerate reads the sizes)."""
    sizes: dict = {}
    for item in text.split(","):
        device, _, size = item.strip().partition("=")
        if not device or not size:
            fail(f"--max-memory takes DEVICE=SIZE pairs like 0=20GiB,cpu=60GiB, got {item!r}")
        sizes[int(device) if device.isdigit() else device] = int(size) if size.isdigit() else size
    return sizes
