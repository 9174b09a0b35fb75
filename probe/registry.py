"""Every analysis probe runs, declared once.

An analysis is one :class:`Analysis` in :data:`ANALYSES`: its name (a result's ``analysis``
attribute and the first word of its files), the variables its results hold, the library
function that runs it, the command-line function that runs it, the function that renders its
report, the one that gives its line in the folder's index, and the index's words for it.
The result files (:func:`probe.files.results.check_schema`), the reports
(:func:`probe.reports.render.render`), the index (:mod:`probe.reports.index_headline`) and
the command tree's test all read this table.  The functions are named by import path
(``"module:function"``), so the library imports neither its reports nor its command line;
:func:`resolve` imports one when it is called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Analysis:
    """One analysis: what every layer of probe needs to know of it.

    Parameters
    ----------
    name
        The result's `analysis` attribute (`collapse`, `paths-count`, ...).
    variables
        The variables a result must hold, each with its dimensions, in order.
    library
        The function that runs it, `"module:function"`.
    command
        The command-line function (or group of commands) that runs it.
    report
        The function that renders its report: `(ds, result_file) -> html`.
    headline
        The function that gives its index line: `ds -> {"lines": ..., "note": ...}`.
    section
        The index's section title, headline column and explanation.
    """

    name: str
    variables: Mapping[str, tuple[str, ...]]
    library: str
    command: str
    report: str
    headline: str
    section: tuple[str, str, str]


def resolve(path: str) -> Callable:
    """The function a `"module:function"` path names, imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def find(name: str) -> Analysis | None:
    """The analysis of that name, or None."""
    return next((a for a in ANALYSES if a.name == name), None)


_REPORTS = "probe.reports."
_CLI = "probe.cli."
_HEADLINES = "probe.reports.index_headline:"

#: In the order of the index's sections.
ANALYSES: tuple[Analysis, ...] = (
    Analysis(
        "collapse",
        {
            "relative_residual": ("variant", "init", "layer", "sequence", "fit", "norm"),
            "effective_rank": ("variant", "init", "layer", "sequence"),
            "stable_rank": ("variant", "init", "layer", "sequence"),
            "cosine_similarity": ("variant", "init", "layer", "sequence"),
        },
        "probe.analyses.collapse:run",
        _CLI + "collapse_cmd:collapse",
        _REPORTS + "render:render_collapse",
        _HEADLINES + "collapse_headline",
        (
            "Rank collapse",
            "r after the last layer",
            "r = ‖res(X)‖ / ‖X‖ after the last layer (fit mean, norm l1inf), mean over "
            "sequences, per variant; one line per init where a run has both.",
        ),
    ),
    Analysis(
        "attention",
        {
            "sink_score": ("init", "layer", "head"),
            "attention_entropy": ("init", "layer", "head"),
            "massive_ratio": ("init", "layer"),
            "anisotropy": ("init", "layer"),
            "sink_rate": ("init",),
            "input_ids": ("sequence", "token"),
        },
        "probe.analyses.attention:run",
        _CLI + "attention_cmd:attention",
        _REPORTS + "attention_report:render_attention",
        _HEADLINES + "attention_headline",
        (
            "Attention sinks",
            "sink rate",
            "Sink rate (Gu et al. 2025): the share of (sequence, layer, head) whose sink score "
            "for the first token exceeds ε, per init.",
        ),
    ),
    Analysis(
        "sweep",
        {  # besides the swept dimensions (attribute sweep_dims)
            "final_residual": ("variant", "init"),
            "first_below": ("variant", "init"),
            "order": ("variant", "init"),
            "sink_rate": ("init",),
            "command": (),
            "done": (),
        },
        "probe.analyses.sweep:run",
        _CLI + "sweep_cmd:sweep",
        _REPORTS + "sweep_report:render_sweep",
        _HEADLINES + "sweep_headline",
        (
            "Sweeps",
            "final r over the points",
            "Lowest and highest final relative residual (median over sequences) over the "
            "sweep's points, per variant; one line per init where the sweep has both.",
        ),
    ),
    Analysis(
        "paths-count",
        {
            "share": ("architecture", "path_length"),
            "cumulative_share": ("architecture", "path_length"),
            "log10_count": ("architecture", "path_length"),
            "count": ("architecture", "path_length"),
            "total": ("architecture",),
            "mean_length": ("architecture",),
        },
        "probe.analyses.paths:count",
        _CLI + "paths_cmd:paths",
        _REPORTS + "paths_report:render_paths",
        _HEADLINES + "paths_count_headline",
        (
            "Paths: how many of each length",
            "paths",
            "(H+1)^L paths and their mean length L·H/(H+1), per architecture.",
        ),
    ),
    Analysis(
        "paths-sample",
        {"ratio": ("init", "order", "depth", "sample", "fit", "norm")},
        "probe.analyses.paths:sample",
        _CLI + "paths_cmd:paths",
        _REPORTS + "paths_report:render_paths",
        _HEADLINES + "paths_sample_headline",
        (
            "Paths: attention products along sampled paths",
            "median distance to rank one",
            "Median over the sampled paths of the deepest depth of the distance of the "
            "attention product to its best rank-one fit (SVD, norm l1inf), per init.",
        ),
    ),
    Analysis(
        "paths-decompose",
        {
            "share": ("init", "layer", "path_length", "sequence", "norm"),
            "truncation_error": ("init", "layer", "path_length", "sequence", "norm"),
            "effective_length": ("init", "layer", "sequence", "norm"),
            "uniform_share": ("layer", "path_length"),
            "uniform_mean_length": ("layer",),
            "output_share": ("init", "path_length", "sequence", "norm"),
            "cosine": ("init", "path_length", "sequence"),
        },
        "probe.analyses.paths:decompose",
        _CLI + "paths_cmd:paths",
        _REPORTS + "paths_report:render_paths",
        _HEADLINES + "paths_decompose_headline",
        (
            "Paths: path-length decomposition",
            "effective path length",
            "Norm-weighted mean path length of the last layer's output (Frobenius, mean over "
            "sequences), per init, beside the mean length by count.",
        ),
    ),
    Analysis(
        "toy",
        {"train_loss": ()},  # the rest depends on the task: see probe.files.results.TOY_SCHEMAS
        "probe.analyses.toy:run",
        _CLI + "toy_cmd:toy_app",
        _REPORTS + "toy:render_toy",
        _HEADLINES + "toy_headline",
        (
            "Toy tasks",
            "final result",
            "Path tasks: the trained network's accuracy beside the per-position baseline; "
            "circle: r after the last recurrent step, per variant (one line per hidden size).",
        ),
    ),
    Analysis(
        "training",
        {
            "train_loss": ("model", "step"),
            "seconds": ("model", "step"),
            "eval_step": ("model", "evaluation"),
            "eval_seconds": ("model", "evaluation"),
            "val_bits_per_char": ("model", "evaluation"),
        },
        "probe.fastformer.train:train",
        _CLI + "fastformer_cmd:train_command",
        _REPORTS + "training:render_training",
        _HEADLINES + "training_headline",
        (
            "Fastformer training",
            "validation bits per character",
            "Validation bits per character at the end of training, per model.",
        ),
    ),
)
