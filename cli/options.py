"""The options every model-based command shares, declared once, and the request built from them.

``probe collapse``, ``probe paths --sample/--decompose`` and ``probe check`` take the same
model and input options: each is one annotated type here (its domain, its help), and each
command only sets its own default.  :func:`model_request` and :func:`inputs_request` turn
the parsed values into the library's request (:class:`probe.Model`, :class:`probe.Inputs`),
which checks what no single option can (``--device`` with ``--device-map``, ``--remote``
with random weights, ...) and says so in one line that names the flags
(:func:`cli.console.in_cli_words`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from probe import names
from probe.request import DEVICE_MAPS

from .console import fail
from .domains import Choice, Count, Device, ImageFolder, OutFolder, Seed, Text, TextFile, option

InitOption = Annotated[
    str,
    option(
        "--init",
        domain=Choice((*names.INITS, "both")),
        help="Weights: pretrained, random, or both.",
    ),
]
DtypeOption = Annotated[
    str | None,
    option(
        "--dtype",
        domain=Choice(names.DTYPES),
        help="Precision of the model run [default: float32; float64 for probe check and "
        "paths --decompose].",
    ),
]
SeedOption = Annotated[
    int,
    option("--seed", domain=Seed(), help="Seed for random init, sampling and synthetic inputs."),
]
DeviceOption = Annotated[str, option("--device", domain=Device(), help="Where the model runs.")]
TextOption = Annotated[
    Path | None,
    option(
        "--text",
        domain=TextFile(),
        help="UTF-8 text cut into sequences [default: the built-in sample text].",
    ),
]
ImagesOption = Annotated[
    Path | None,
    option(
        "--images",
        domain=ImageFolder(),
        help="A folder of images, for an image model (ViT) [default: seeded noise images].",
    ),
]
TokensOption = Annotated[int, option("--tokens", domain=Count(2), help="Real tokens per sequence.")]
BatchSizeOption = Annotated[
    int, option("--batch-size", domain=Count(1), help="Sequences per forward pass.")
]
RemoteOption = Annotated[
    bool,
    typer.Option(
        "--remote",
        help="Run on NDIF through nnsight's remote backend (pretrained models it hosts, "
        "bfloat16; needs NDIF_API_KEY and the network).",
    ),
]
AllowMissingOption = Annotated[
    bool,
    typer.Option(
        "--allow-missing-weights",
        help="Probe a checkpoint that lacks tensors (they stay at random init; "
        "the result and report say so).",
    ),
]

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
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")]
OutOption = Annotated[
    Path, option("--out", domain=OutFolder(), help="Folder for results and reports.")
]


def model_request(
    init: str,
    seed: int,
    dtype: str | None,
    device: str,
    device_map: str | None = None,
    max_memory: str | None = None,
    offload_folder: Path | None = None,
    remote: bool = False,
    allow_missing_weights: bool = False,
) -> dict:
    """The keywords of :class:`probe.Model` (all but the model's name) from the options.

    The model checks how they combine (``--device`` with ``--device-map``, ``--remote``
    with random weights, ...) when it is built, in the one line the library says; here only
    ``--max-memory``'s text is read into accelerate's form, where it applies at all."""
    if max_memory is not None and device_map is not None:
        max_memory = memory(max_memory)
    return {
        "init": init,
        "seed": seed,
        "dtype": dtype,
        "device": device,
        "device_map": device_map,
        "max_memory": max_memory,
        "offload_folder": offload_folder,
        "remote": remote,
        "allow_missing_weights": allow_missing_weights,
    }


def models_request(names: list[str], **options) -> list:
    """One :class:`probe.Model` per name, all checked before anything is loaded."""
    from probe.request import Model

    request = model_request(**options)
    return [Model(name, **request) for name in names]


def inputs_request(
    text: Path | None = None,
    images: Path | None = None,
    sequences: int | str | None = None,
    tokens: int | None = None,
    batch_size: int | None = None,
):
    """The :class:`probe.Inputs` of the options (a size left at None: the analysis' default)."""
    from probe.request import Inputs

    if isinstance(sequences, str) and sequences != "all":
        sequences = int(sequences)
    return Inputs(
        text=text, images=images, sequences=sequences, tokens=tokens, batch_size=batch_size
    )


def memory(text: str) -> dict:
    """``0=20GiB,cpu=60GiB`` -> {0: "20GiB", "cpu": "60GiB"} (accelerate reads the sizes)."""
    sizes: dict = {}
    for item in text.split(","):
        device, _, size = item.strip().partition("=")
        if not device or not size:
            fail(f"--max-memory takes DEVICE=SIZE pairs like 0=20GiB,cpu=60GiB, got {item!r}")
        sizes[int(device) if device.isdigit() else device] = int(size) if size.isdigit() else size
    return sizes
