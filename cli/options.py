"""The options every model-based command shares, declared once, and the request built from them.

``probe collapse``, ``probe paths --sample/--decompose`` and ``probe check`` take the same
model and input options: each is one annotated type here (its domain, its help) and one
field of :class:`Shared` (its default).  A command takes them with one decorator, :func:`shared_options`, naming
the ones it takes and the defaults it sets, and one parameter ``shared: Shared`` that they
replace in the signature typer reads::

    @app.command()
    @shared_options(*SHARED, tokens=64, dtype="float32", batch_size=16)
    def attention(model: Annotated[str, argument(...)], ..., *, shared: Shared) -> None:
        (request,) = shared.models([model])       # probe.Model, checked
        inputs = shared.inputs(sequences)         # probe.Inputs (its own --sequences)
        ... shared.out_dir ...

``*SHARED`` takes every shared option; a command that takes only some names them
(``@shared_options("device", init="random", dtype="float64", tokens=8)`` for ``probe
check``); one it does not take keeps :class:`Shared`'s default.  Each declares its ``--help``
panel (:mod:`cli.help`), where it stands beside the command's own options of that panel,
in the order of :data:`SHARED`; a default that depends on the command's other options is
given as :class:`Shown` (``dtype=Shown(None, "float32 with --sample, ...")``), so
``--help`` says it once, in words.  ``--quiet`` applies before the
command runs; the request is built only when the command asks, after its own checks, so its
errors come in the command's order.  :class:`probe.Model` and :class:`probe.Inputs` check
what no single option can (``--device`` with ``--device-map``, ``--remote`` with random
weights, ...) and say so in one line that names the flags (:func:`cli.console.in_cli_words`).
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated

import typer

from probe import names
from probe.requests.overrides import parse_settings
from probe.requests.request import DEVICE_MAPS, Inputs, Model

from .console import fail, settings
from .domains import (
    BranchScale,
    Choice,
    Count,
    Device,
    ImageFolder,
    MaskName,
    Memory,
    OutFolder,
    Revision,
    Seed,
    Setting,
    TextFile,
    option,
)
from .help import ANALYSIS, INPUTS, MODEL, OUTPUT, RUNNING, described

InitOption = Annotated[
    str,
    option(
        "--init",
        domain=Choice((*names.INITS, "both"), metavar="INIT"),
        help="Which weights run.",
        rich_help_panel=MODEL,
    ),
]
DtypeOption = Annotated[
    str | None,
    option(
        "--dtype",
        domain=Choice(names.DTYPES, metavar="DTYPE"),
        help="Precision the model runs in.",
        rich_help_panel=MODEL,
    ),
]
SeedOption = Annotated[
    int,
    option(
        "--seed",
        domain=Seed(),
        help="Seed of random weights, sampling and synthetic inputs.",
        rich_help_panel=MODEL,
    ),
]
DeviceOption = Annotated[
    str,
    option("--device", domain=Device(), help="Where the model runs.", rich_help_panel=RUNNING),
]
TextOption = Annotated[
    Path | None,
    option(
        "--text",
        domain=TextFile(),
        help="UTF-8 text cut into sequences.",
        show_default="the built-in sample text",
        rich_help_panel=INPUTS,
    ),
]
ImagesOption = Annotated[
    Path | None,
    option(
        "--images",
        domain=ImageFolder(),
        help="A folder of images, for an image model (ViT).",
        show_default="seeded noise images",
        rich_help_panel=INPUTS,
    ),
]
TokensOption = Annotated[
    int,
    option("--tokens", domain=Count(2), help="Real tokens per sequence.", rich_help_panel=INPUTS),
]
#: An analysis' own option (collapse, attention), declared once for both.
BranchScaleOption = Annotated[
    str,
    option(
        "--branch-scale",
        domain=BranchScale(),
        help="Scale every attention and MLP branch: y = x + ALPHA f(x) (Noci et al. 2022).",
        rich_help_panel=ANALYSIS,
    ),
]
MaskOption = Annotated[
    str,
    option(
        "--mask",
        domain=MaskName(),
        help="The attention mask of every layer: model (its own), bidirectional, causal, "
        "window:W (keys within W on either side) or causal-window:W (itself and the W keys "
        "before it) (Wu et al. 2024).",
        rich_help_panel=ANALYSIS,
    ),
]
BatchSizeOption = Annotated[
    int,
    option(
        "--batch-size", domain=Count(1), help="Sequences per forward pass.", rich_help_panel=RUNNING
    ),
]
RemoteOption = Annotated[
    bool,
    typer.Option(
        "--remote",
        help="Run on NDIF through nnsight: the pretrained models it hosts, in bfloat16 "
        "(needs NDIF_API_KEY and the network).",
        rich_help_panel=RUNNING,
    ),
]
AllowMissingOption = Annotated[
    bool,
    typer.Option(
        "--allow-missing-weights",
        help="Run a checkpoint that lacks tensors (they stay random; the result says so).",
        rich_help_panel=MODEL,
    ),
]

DeviceMapOption = Annotated[
    str | None,
    option(
        "--device-map",
        domain=Choice(DEVICE_MAPS, metavar="MAP"),
        help="Spread a model too large for one device over the GPUs, CPU and disk (accelerate).",
        rich_help_panel=RUNNING,
    ),
]
MaxMemoryOption = Annotated[
    str | None,
    option(
        "--max-memory",
        domain=Memory(),
        help="With --device-map: memory per device, e.g. 0=20GiB,cpu=60GiB.",
        rich_help_panel=RUNNING,
    ),
]
OffloadFolderOption = Annotated[
    Path | None,
    option(
        "--offload-folder",
        domain=OutFolder(),
        help="With --device-map: folder for weights offloaded to disk.",
        rich_help_panel=RUNNING,
    ),
]
SetOption = Annotated[
    list[str] | None,
    option(
        "--set",
        domain=Setting(),
        help="Change a config field before the model is built (random init only; "
        "repeatable), e.g. n_layer=4.",
        rich_help_panel=MODEL,
    ),
]
RevisionOption = Annotated[
    str | None,
    option(
        "--revision",
        domain=Revision(),
        help="A hub branch, tag or commit, e.g. Pythia's step1000 (offline: one in the "
        "HuggingFace cache).",
        rich_help_panel=MODEL,
    ),
]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress output.", rich_help_panel=OUTPUT)
]
OutOption = Annotated[
    Path,
    option(
        "--out", domain=OutFolder(), help="Folder for results and reports.", rich_help_panel=OUTPUT
    ),
]


@dataclass(frozen=True)
class Shared:
    """The shared options of one command line, in the order ``--help`` lists them.  Each
    field is one option (its annotated type above) at its default; a command that does not
    take an option runs at that default (``probe check``: seed 0, no device map, ...)."""

    init: InitOption = "both"
    text: TextOption = None
    images: ImagesOption = None
    tokens: TokensOption = None
    seed: SeedOption = 0
    device: DeviceOption = "cpu"
    device_map: DeviceMapOption = None
    max_memory: MaxMemoryOption = None
    offload_folder: OffloadFolderOption = None
    remote: RemoteOption = False
    dtype: DtypeOption = None
    batch_size: BatchSizeOption = None
    allow_missing_weights: AllowMissingOption = False
    config: SetOption = None
    revision: RevisionOption = None
    quiet: QuietOption = False
    out_dir: OutOption = Path("probe-reports")

    def models(self, names: list[str]) -> list[Model]:
        """One :class:`probe.Model` per name, all checked before anything is loaded.

        The model checks how the options combine (``--device`` with ``--device-map``,
        ``--remote`` with random weights, ...) when it is built, in the one line the library
        says; here only ``--max-memory``'s text is read into accelerate's form, where it
        applies at all."""
        max_memory = self.max_memory
        if max_memory is not None and self.device_map is not None:
            max_memory = memory(max_memory)
        overrides = parse_settings(self.config)
        return [
            Model(
                name,
                init=self.init,
                seed=self.seed,
                dtype=self.dtype,
                device=self.device,
                device_map=self.device_map,
                max_memory=max_memory,
                offload_folder=self.offload_folder,
                remote=self.remote,
                allow_missing_weights=self.allow_missing_weights,
                config=overrides,
                revision=self.revision,
            )
            for name in names
        ]

    def inputs(self, sequences: int | str | None = None) -> Inputs:
        """The :class:`probe.Inputs` of the options and the command's own ``--sequences``
        (a size left at None: the analysis' default)."""
        if isinstance(sequences, str) and sequences != "all":
            sequences = int(sequences)
        return Inputs(
            text=self.text,
            images=self.images,
            sequences=sequences,
            tokens=self.tokens,
            batch_size=self.batch_size,
        )


@dataclass(frozen=True)
class Shown:
    """A command's default for a shared option that depends on its other options: the
    command starts from ``value``, ``--help`` says ``words``."""

    value: object
    words: str


#: The names of every shared option (``@shared_options(*SHARED)`` takes them all).
SHARED = tuple(field.name for field in fields(Shared))


def shared_options(*taken: str, **defaults):
    """Give the decorated command the shared options ``taken`` (at :class:`Shared`'s
    defaults) and ``defaults`` (at the defaults given), as one :class:`Shared` value.

    They take the place of the command's keyword-only parameter ``shared: Shared`` in the
    signature typer reads (``__signature__``), in the order of :data:`SHARED`.  ``--quiet``,
    where the command takes it, applies before the command runs."""
    wanted = [name for name in SHARED if name in taken or name in defaults]
    unknown = set(taken).union(defaults).difference(SHARED)
    if unknown:
        raise TypeError(f"no shared option {', '.join(sorted(unknown))}")
    types, initial = typing.get_type_hints(Shared, include_extras=True), Shared()

    def decorate(command):
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        at = [param.name for param in own].index("shared")
        added = []
        for name in wanted:
            default, annotation = defaults.get(name, getattr(initial, name)), types[name]
            if isinstance(default, Shown):
                default, annotation = default.value, described(annotation, default.words)
            added.append(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
                )
            )
        params = [*own[:at], *added, *own[at + 1 :]]

        @functools.wraps(command)
        def with_shared(**given):
            shared = Shared(**{name: given.pop(name) for name in wanted})
            if "quiet" in wanted:
                settings["quiet"] = shared.quiet
            return command(**given, shared=shared)

        with_shared.__signature__ = inspect.Signature(params)
        with_shared.__annotations__ = {param.name: param.annotation for param in params}
        return with_shared

    return decorate


def memory(text: str) -> dict:
    """``0=20GiB,cpu=60GiB`` -> {0: "20GiB", "cpu": "60GiB"} (accelerate reads the sizes)."""
    sizes: dict = {}
    for item in text.split(","):
        device, _, size = item.strip().partition("=")
        if not device or not size:
            fail(f"--max-memory takes DEVICE=SIZE pairs like 0=20GiB,cpu=60GiB, got {item!r}")
        ascii_int = re.compile(r"[0-9]{1,19}")  # ASCII digits: "٠" is no device
        index = int(device) if ascii_int.fullmatch(device) else device
        sizes[index] = int(size) if ascii_int.fullmatch(size) else size
    return sizes
