"""``probe sweep MODEL``: one ``probe collapse`` per point of a grid, gathered into one result.

Made of the shared request options (:mod:`cli.options`) and the grid's own: ``--set
KEY=V1,V2`` (repeatable), ``--tokens``, ``--seeds``, ``--branch-scale``, ``--mask``, ``--revisions``,
``--steps`` (with several checkpoint folders as MODEL).  Everything is checked before the
first point runs: the grid, every point's request and config, its size against
``--max-points`` and the largest point against free memory.  ``--dry-run`` stops there and
prints the points with their estimates.

Each finished point is a file in ``<out>/<name>.points/`` (:mod:`probe.analyses.sweep_points`),
so a sweep stopped by Ctrl-C, ``kill -9`` or a failure keeps its points and the same command
resumes.  Once every point is there, the result and its report are put in place together
and the point store is removed: the result holds every point.  Under torchrun the ranks take
the points round robin and rank 0 gathers them (:func:`cli.sharded.run_sharded`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from probe import names
from probe.requests import checks

from .console import command_line, fail, out
from .domains import CommaList, Count, ModelName, Real, Text, argument, bounds, option
from .help import ANALYSIS, GRID, INPUTS, RUNNING
from .options import SHARED, Shared, shared_options


class Numbers(CommaList):
    """A comma list of whole numbers and ranges (``64,256``, ``0-4``, ``0,3,7``) in
    [low, high]; ``examples`` are values the fuzzer lists (any in the bounds are taken).
    ``metavar``: the single value's (``N``, ``SEED``), as a list: ``N,...``."""

    def __init__(self, low: int, high: int, examples: tuple[str, ...], metavar: str = "N") -> None:
        super().__init__(examples, self._numbers, metavar=f"{metavar},...")
        self.low, self.high = low, high

    def _numbers(self, text: str):
        from probe.analyses.sweep_points import parse_counts

        return parse_counts(text, self.name.lstrip("-").replace("-", "_"), self.low, self.high)

    def describe(self) -> str:
        return f"a comma list or ranges A-B, each {bounds(self.low, self.high)}"


class Values(Text):
    """A comma list of one option's values, read by the sweep's plan (``--branch-scale
    1,0.5``, ``--revisions step0,step1000``); ``metavar``: the single value's; ``kind``: the
    list's, for the fuzzer (``branch-scales``, ``revisions``)."""

    def __init__(self, metavar: str, kind: str) -> None:
        super().__init__()
        self.metavar, self.kind = f"{metavar},...", kind


class Setting(Text):
    """``KEY=V1,V2,...``: a config field and the values it sweeps."""

    kind = "grid-setting"
    metavar = "KEY=VALUE,..."

    def check(self, value):
        from probe.analyses.sweep_points import parse_setting

        text = super().check(value)
        parse_setting(text)
        return text


def _parse_variants(text: str):
    from probe.surgery.ablate import parse_variants

    return parse_variants(text)


#: Shared options a sweep takes as lists of its own (--tokens, --seeds, --set, --revisions),
#: and --remote, which it does not take: a sweep loads each point's model itself.
OWN = ("tokens", "seed", "config", "revision", "remote")


@shared_options(*(name for name in SHARED if name not in OWN), dtype="float32", batch_size=16)
def sweep(
    models: Annotated[
        list[str],
        argument(
            "MODEL",
            ModelName(),
            help="A hub id, a local folder, a bundled name, a shipped checkpoint series "
            "(gpt2-tiny-steps), or several checkpoint folders with --steps.",
        ),
    ],
    settings: Annotated[
        list[str] | None,
        option(
            "--set",
            domain=Setting(),
            help="A config field and its values, e.g. n_layer=2,4,8; repeatable: a grid.",
            rich_help_panel=GRID,
        ),
    ] = None,
    tokens: Annotated[
        str | None,
        option(
            "--tokens",
            domain=Numbers(2, checks.MAX_COUNT, ("8", "12", "16")),
            help="Real tokens per sequence, e.g. 64,256,1024 (one value: every point's).",
            show_default="128",
            rich_help_panel=GRID,
        ),
    ] = None,
    seeds: Annotated[
        str | None,
        option(
            "--seeds",
            domain=Numbers(0, checks.MAX_SEED, ("0", "1", "2"), metavar="SEED"),
            help="Seeds of random weights and synthetic inputs, e.g. 0-4 or 0,3,7 "
            "(one value: every point's).",
            show_default="0",
            rich_help_panel=GRID,
        ),
    ] = None,
    branch_scale: Annotated[
        str | None,
        option(
            "--branch-scale",
            domain=Values("ALPHA", "branch-scales"),
            help="Scales ALPHA of every attention and MLP branch, y = x + ALPHA f(x), e.g. "
            "1,0.5,1/sqrt(L) (L: the depth).",
            show_default="1",
            rich_help_panel=GRID,
        ),
    ] = None,
    mask: Annotated[
        str | None,
        option(
            "--mask",
            domain=Values("MASK", "masks"),
            help="Attention masks of every layer, e.g. bidirectional,causal,window:2: model "
            "(its own), bidirectional, causal, window:W, causal-window:W (Wu et al. 2024).",
            show_default="model",
            rich_help_panel=GRID,
        ),
    ] = None,
    revisions: Annotated[
        str | None,
        option(
            "--revisions",
            domain=Values("REV", "revisions"),
            help="Hub revisions, e.g. step0,step1000.",
            rich_help_panel=GRID,
        ),
    ] = None,
    steps: Annotated[
        str | None,
        option(
            "--steps",
            domain=Numbers(0, checks.MAX_COUNT, ("0", "10", "100")),
            help="The training step of each MODEL folder, in order, e.g. 0,100,1000.",
            rich_help_panel=GRID,
        ),
    ] = None,
    variants: Annotated[
        str,
        option(
            "--variants",
            domain=CommaList(
                names.VARIANTS + names.NORM_VARIANTS + names.COMPOSED_NORM_VARIANTS,
                _parse_variants,
                words=("all",),
                metavar="all|LIST",
            ),  # fmt: skip
            help="all (the paper's four), or a comma list of SAN, SAN+MLP, SAN+skip, "
            "transformer, LN-affine, no-LN and SAN/no-LN, SAN/LN-affine, SAN+MLP/no-LN, ...",
            rich_help_panel=ANALYSIS,
        ),
    ] = "all",
    sequences: Annotated[
        int,
        option(
            "--sequences",
            domain=Count(1),
            help="Sequences (images) per point.",
            rich_help_panel=INPUTS,
        ),
    ] = 32,
    no_attention: Annotated[
        bool,
        typer.Option(
            "--no-attention",
            help="Skip the attention statistics (sink rate, massive ratio) at each point: "
            "NaN in the result.",
            rich_help_panel=ANALYSIS,
        ),
    ] = False,
    max_points: Annotated[
        int,
        option(
            "--max-points",
            domain=Count(1),
            help="Refuse a grid with more points.",
            rich_help_panel=RUNNING,
        ),
    ] = 1000,
    max_hours: Annotated[
        float | None,
        option(
            "--max-hours",
            domain=Real(0, None, low_open=True),
            help="Refuse a grid whose forward passes alone take longer (the dry run's estimate).",
            rich_help_panel=RUNNING,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the points and their estimated memory and time; run nothing.",
            rich_help_panel=RUNNING,
        ),
    ] = False,
    *,
    shared: Shared,
) -> None:
    """Collapse over a grid of configs, scales, context lengths, seeds or checkpoints."""
    from probe.analyses import sweep as analysis
    from probe.analyses import sweep_cost

    folders: list[tuple[int, str]] | None = None
    if steps is not None:
        from probe.analyses.sweep_points import parse_counts

        numbers = parse_counts(steps, "steps", 0, checks.MAX_COUNT)
        if len(numbers) != len(models):
            fail(f"--steps gives one step per MODEL folder: {len(models)} folders, --steps {steps}")
        folders = list(zip(numbers, models, strict=True))
        for _, folder in folders:
            if not Path(folder).expanduser().is_dir():
                fail(f"--steps takes checkpoint folders as MODEL; {folder} is not a folder")
    elif len(models) > 1:
        fail("give one MODEL, or several checkpoint folders with --steps")
    (request,) = shared.models(models[:1])
    config = dict(_setting(text) for text in settings or [])
    if len(config) != len(settings or []):
        fail("--set gives a config field more than once; give each field once")
    plan = analysis.plan(
        request, shared.inputs(sequences), config=config, branch_scale=branch_scale,
        mask=mask, revisions=revisions, steps=folders, tokens=tokens, seeds=seeds, variants=variants,
        attention=not no_attention, max_points=max_points, command=command_line(),
    )  # fmt: skip
    found = sweep_cost.costs(plan)
    sweep_cost.require(plan, found, max_hours)
    name = result_name(plan)
    if dry_run:
        print_points(plan, found, plan.store(shared.out_dir))
        return
    from . import sweep_run

    sweep_run.run(plan, shared.out_dir, name)


def _setting(text: str) -> tuple[str, tuple]:
    from probe.analyses.sweep_points import parse_setting

    return parse_setting(text)


def result_name(plan) -> str:
    """``sweep-<model>-<init>-<dtype>-<id>``: the id is the whole sweep's."""
    from probe.reports.naming import model_stem

    model = plan.model
    parts = ["sweep", model_stem(str(model.name)), *model.init, str(model.dtype or "float32")]
    return "-".join([*parts, plan.settings_id])


def print_points(plan, found, store) -> None:
    """One line per point (its values, whether the store has it, its estimates), the total."""
    import numpy as np

    from probe.requests.memory import fmt

    done = store.done(plan.points)
    for number, (point, cost, have) in enumerate(zip(plan.points, found, done, strict=True)):
        state = "done" if have else "to run"
        out.print(
            f"point {number + 1}/{len(plan.points)}: {point.label()} · {state} · "
            f"{cost.parameters:,} parameters · memory {fmt(cost.bytes)} · "
            f"time >= {cost.seconds:.3g} s",
            markup=False,
        )
    todo = [c for c, have in zip(found, done, strict=True) if not have]
    lower = sum(c.seconds for c in todo)
    # Finished points say how far the lower bound is from what a point takes here.
    ratios = []
    for point, cost, have in zip(plan.points, found, done, strict=True):
        seconds = store.read(point).attrs.get("seconds") if have else None
        if seconds is not None and cost.seconds > 0:
            ratios.append(float(seconds) / cost.seconds)
    if ratios:
        time_text = (
            f"time about {lower * float(np.median(ratios)):.3g} s (the lower bound "
            f"{lower:.3g} s scaled as the {len(ratios)} finished points measured)"
        )
    else:
        time_text = (
            f"time >= {lower:.3g} s (forward passes at this machine's matrix-product rate: "
            "a lower bound; loading and the metrics come on top)"
        )
    out.print(
        f"total: {len(plan.points)} points ({len(plan.points) - len(todo)} done), "
        f"{len(todo)} to run, {time_text}, memory at most {fmt(max(c.bytes for c in found))} "
        "at once",
        markup=False,
    )
    out.print("dry run: nothing was run or written", markup=False)
