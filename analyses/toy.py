"""The paper's trained experiments as Datasets: sort, convex hull, memorization, circle.

Dong, Cordonnier & Loukas (2021), Section 4, train small post-LN self-attention
networks (probe.toy.model) and evaluate them through random subsets of their
paths: for each length k = 0..L, ``n_paths`` uniform paths of length k, summed,
``repeats`` times.  Short paths carrying most of the accuracy is the claim.  The
full model's accuracy and the input-blind baselines are measured on the same
evaluation set.

Path-restricted evaluation follows the paper's rules by default (the runs of its
``no_sub_path`` option): each path is a chain of single heads whose attention is
recomputed from the path's own state (``path_attention="own"``), each head layer
normalised by a LayerNorm without learned scale and shift, and one more such
LayerNorm on the summed paths (``path_norm="paper"``).  ``"full"`` and
``"trained"`` are probe's earlier rules: the full model's attention and the
trained LayerNorms, nothing on the sum.  ``sub_path=True`` evaluates each path's
exact term instead (probe.toy.model).

The circle experiment trains a one-layer network to move two points one step
along two arcs of a circle, then applies it to its own output for ``steps``
steps; the relative residual of the 2-token matrix (probe.measures.metrics) says whether
the two points merge.  ``setup="paper"`` uses the paper's three networks
(``run_circle.py``): every network keeps the attention skip connection and its
LayerNorm, and the embedding ends in a LayerNorm; "SAN" is that network;
"SAN+skip" adds a residual across recurrent steps (trained on each batch plus
the previous batch's inputs, run as s <- s + f(s), and f(s) is what is drawn
and measured); "SAN+MLP" adds a feed-forward sublayer.  ``setup="strict"``
keeps probe's stricter definitions: "SAN" without any skip connection,
"SAN+skip" with the attention skip (the paper's "SAN"), "SAN+MLP" with the
MLP and no attention skip.  The paper swept hidden sizes 32 and 128; both run.

Every setting that still differs from the paper's scripts is listed in the
result's ``deviations`` attribute (``deviations(task, ...)``), with the option
that runs the paper's value where there is one.

``run(task, **options)`` returns the Dataset; ``TASKS`` holds the defaults,
``PAPER`` the paper's values of the same settings, and ``QUICK`` the reduced
sizes of ``quick=True``.

The analysis is four modules: the settings and the paper's values
(``toy_settings``), the checks of a run's rules, sizes and memory (``toy_checks``),
the training runs that make the Datasets (``toy_runs``), and this one, which puts
them together and re-exports their public names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib import metadata

import torch
import xarray as xr

from probe.files.results import utc_now
from probe.requests import checks

from .toy_checks import (
    MAX_LR,
    MAX_SHIFT,
    TOY_ACTIVATIONS,
    TOY_VOCAB_MAX,
    check,
    rules,
)
from .toy_runs import circle_run, circle_task, path_task
from .toy_settings import (
    CIRCLE_NETWORKS,
    CIRCLE_WORDS,
    PAPER,
    QUICK,
    TASKS,
    VARIANTS,
    deviations,
    settings,
    show,
)

__all__ = [
    "CIRCLE_NETWORKS", "CIRCLE_WORDS", "MAX_LR", "MAX_SHIFT", "PAPER", "QUICK", "TASKS",
    "TOY_ACTIVATIONS", "TOY_VOCAB_MAX", "VARIANTS", "Progress", "circle_run", "deviations",
    "run", "settings",
]  # fmt: skip

Progress = Callable[[int, int, str], None]
"""A progress callback: called with (steps done, steps in all, a label)."""


def run(
    task: str,
    *,
    seed: int = 0,
    device: str = "cpu",
    quick: bool = False,
    n_paths: int = 5,
    repeats: int = 5,
    sub_path: bool = False,
    path_attention: str | None = None,
    path_norm: str | None = None,
    setup: str | None = None,
    text: str | None = None,
    progress: Progress | None = None,
    command: str = "",
    **overrides,
) -> xr.Dataset:
    """Train and evaluate one task; see the module docstring.

    Parameters
    ----------
    task
        `sort`, `convex-hull`, `memorization` or `circle`.
    seed
        Seed of the data, the initialisation and the paths drawn.
    device
        `cpu`, `cuda` or `cuda:N`.
    quick
        Reduced sizes (`QUICK`) for a run of minutes.
    n_paths
        Paths drawn per length k for a path-restricted evaluation.
    repeats
        How many times each length's evaluation is drawn.
    sub_path
        Evaluate each path's exact term instead of the chain of single heads.
    path_attention
        `own` or `full`: the rules of path-restricted evaluation (default: the paper's,
        `own`); not with `sub_path=True` nor for the circle.
    path_norm
        `paper` or `trained` (default: the paper's, `paper`); not with `sub_path=True`
        nor for the circle.
    setup
        `paper` or `strict` (default `paper`): the circle's networks; the circle only.
    text
        The text the memorization task reads; None: the sample text shipped with probe.
    progress
        Called with (steps done, steps in all, a label) as training and evaluation go;
        None: silent.
    command
        The "reproduce with" line the result records.
    **overrides
        Settings of the task (`TASKS`: `width`, `depth`, `hidden`, `epochs`, `lr`, ...)
        to change; None keeps the default.

    Returns
    -------
    xarray.Dataset
        The task's accuracies by path length, with the full model's and the baselines'
        (the circle: its trajectories and relative residuals); attributes that hold the
        settings and every deviation from the paper's run (`deviations`).

    Raises
    ------
    ProbeError
        An unknown task or rule, a rule that does not apply to the task, a setting
        outside its domain, too little memory.
    """
    opts = settings(task, quick, **overrides)
    path_attention, path_norm, setup = rules(task, sub_path, path_attention, path_norm, setup)
    dev = _device(device)
    check(opts, n_paths, repeats, str(dev), task)
    progress = progress or (lambda done, total, label: None)
    started = time.perf_counter()
    if task == "circle":
        ds = circle_task(opts, setup, seed, dev, progress)
    else:
        ds = path_task(
            task, opts, seed, dev, n_paths, repeats, sub_path, path_attention, path_norm, text,
            progress,
        )  # fmt: skip
    gone = deviations(
        task, opts, sub_path=sub_path, path_attention=path_attention, path_norm=path_norm,
        setup=setup, text=text,
    )  # fmt: skip
    ds.attrs.update(
        analysis="toy",
        task=task,
        model=f"toy-{task}",
        family="toy post-LN SAN",
        seed=seed,
        device=str(dev),
        quick=quick,
        seconds=round(time.perf_counter() - started, 3),
        threads=torch.get_num_threads(),
        created=utc_now(),
        command=command,
        probe_version=_version("probe"),
        torch_version=_version("torch"),
        **{k: show(v) if isinstance(v, tuple) else v for k, v in opts.items()},
        deviations=json.dumps(gone),
    )
    return ds


def _device(device: str) -> torch.device:
    return torch.device(checks.device(device))


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
