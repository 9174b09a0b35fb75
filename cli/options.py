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

from .domains import Choice, Count, Device, ImageFolder, OutFolder, Seed, TextFile, option
from .placement import placement

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

    ``--device cpu`` is the command's default, not a choice against ``--device-map``: it
    is passed on only where the user moved it off the CPU."""
    spread = placement(device, device_map, max_memory, offload_folder)
    return {
        "init": init,
        "seed": seed,
        "dtype": dtype,
        "device": None if spread else device,
        "remote": remote,
        "allow_missing_weights": allow_missing_weights,
        **spread,
    }


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
