"""The toy tasks' settings: probe's defaults, the paper's values, and the differences.

``TASKS`` holds the defaults of each task (probe.analyses.toy), ``PAPER`` the values of
the same settings in the paper's scripts and README (Dong, Cordonnier & Loukas 2021),
and ``QUICK`` the reduced sizes of ``quick=True``.  ``settings(task, quick, **overrides)``
resolves them for one run; ``deviations(task, opts, ...)`` lists, one line each, every
way that run differs from the paper's, naming the parameter that runs the paper's
value where there is one.  The circle's networks (``VARIANTS``) are defined per setup
in ``CIRCLE_NETWORKS`` and in words in ``CIRCLE_WORDS``.
"""

from __future__ import annotations

from probe.errors import ProbeError

#: The defaults: the paper's settings (its README's commands and scripts) except the
#: learning rates of sort and convex hull (see PAPER and deviations()).
TASKS: dict[str, dict] = {
    "sort": dict(width=2, depth=6, hidden=48, train=1000, eval=200, epochs=65, lr=1e-3,
                 batch_size=30, weight_decay=0.0, schedule="constant", length=8, symbols=10),
    "convex-hull": dict(width=3, depth=6, hidden=84, train=10000, eval=300, epochs=70, lr=1e-3,
                        batch_size=30, weight_decay=1e-3, schedule="steps", points=10,
                        box=10.0, shift=3.3),
    "memorization": dict(width=2, depth=6, hidden=250, train=500, epochs=50, lr=3e-4,
                         batch_size=8, weight_decay=0.0, schedule="linear", tokens=128,
                         positions=False),
    "circle": dict(width=2, depth=1, hidden=(32, 128), points=1000, steps=300, epochs=70,
                   lr=1e-5, batch_size=30, weight_decay=0.0, schedule="constant"),
}  # fmt: skip

#: The paper's values of every setting in TASKS (run_sort.py, run_convex_hull.py,
#: run_memorization.py with its Trainer, run_circle.py, and the README's commands; the
#: circle's hidden sizes are the two its figure sweeps).
PAPER: dict[str, dict] = {
    "sort": dict(width=2, depth=6, hidden=48, train=1000, eval=200, epochs=65, lr=1e-5,
                 batch_size=30, weight_decay=0.0, schedule="constant", length=8, symbols=10),
    "convex-hull": dict(width=3, depth=6, hidden=84, train=10000, eval=300, epochs=70, lr=1e-5,
                        batch_size=30, weight_decay=1e-3, schedule="steps", points=10,
                        box=10.0, shift=3.3),
    "memorization": dict(width=2, depth=6, hidden=250, train=500, epochs=50, lr=3e-4,
                         batch_size=8, weight_decay=0.0, schedule="linear", tokens=128,
                         positions=False),
    "circle": dict(width=2, depth=1, hidden=(32, 128), points=1000, steps=299, epochs=70,
                   lr=1e-5, batch_size=30, weight_decay=0.0, schedule="constant"),
}  # fmt: skip

#: Why a default differs from the paper's value, where it does on purpose.
_WHY = {
    "lr": "probe's default, because the paper's rate leaves the network far from trained "
    "after the paper's epochs (the README's table has runs at both rates)",
    "steps": "a round number of steps; the paper's script draws 300 points, start included",
}

#: ``quick=True``: the same experiment at a size that runs in well under a minute on one core.
QUICK: dict[str, dict] = {
    "sort": dict(train=300, eval=100, epochs=12),
    "convex-hull": dict(train=400, eval=100, epochs=6),
    "memorization": dict(train=24, tokens=32, hidden=64, epochs=12),
    "circle": dict(points=200, steps=60, epochs=10),
}

VARIANTS = ("SAN", "SAN+skip", "SAN+MLP")  # the circle's networks, in the paper's names

#: Per setup and circle variant: (attention skip, MLP, residual across recurrent steps).
CIRCLE_NETWORKS: dict[str, dict[str, tuple[bool, bool, bool]]] = {
    "paper": {"SAN": (True, False, False), "SAN+skip": (True, False, True),
              "SAN+MLP": (True, True, False)},
    "strict": {"SAN": (False, False, False), "SAN+skip": (True, False, False),
               "SAN+MLP": (False, True, False)},
}  # fmt: skip

#: What each circle variant is, in words, per setup (for reports and attrs).
CIRCLE_WORDS: dict[str, str] = {
    "paper": "the paper's definitions (run_circle.py): every network keeps the attention skip "
    "connection and LayerNorm, and the embedding ends in a LayerNorm; SAN: that network; "
    "SAN+skip: plus a residual across recurrent steps, s <- s + f(s), with f(s) drawn; "
    "SAN+MLP: plus a feed-forward sublayer",
    "strict": "probe's stricter definitions, not the paper's: SAN has no skip connection at "
    "all; SAN+skip has the attention skip (the paper's SAN); SAN+MLP has the feed-forward "
    "sublayer but no attention skip",
}


def settings(task: str, quick: bool = False, **overrides) -> dict:
    """The task's defaults, reduced by ``quick``, then ``overrides`` (None = keep)."""
    if task not in TASKS:
        raise ProbeError(f"unknown toy task {task!r}; choose from {', '.join(TASKS)}")
    chosen = dict(TASKS[task])
    if quick:
        chosen.update(QUICK[task])
    for key, value in overrides.items():
        if value is not None:
            chosen[key] = value
    if task == "circle":
        chosen["hidden"] = _hidden_sizes(chosen["hidden"])
    return chosen


def deviations(
    task: str,
    opts: dict,
    *,
    sub_path: bool = False,
    path_attention: str | None = None,
    path_norm: str | None = None,
    setup: str | None = None,
    text: str | None = None,
) -> list[str]:
    """Every way a run with ``opts`` differs from the paper's run of ``task``, one line each."""
    lines = []
    for key, paper in PAPER[task].items():
        if key in opts and opts[key] != paper:
            why = f"; {_WHY[key]}" if key in _WHY and opts[key] == TASKS[task].get(key) else ""
            hint = _paper_hint(task, key, paper)
            lines.append(f"{key} {show(opts[key])}: the paper's is {show(paper)} ({hint}){why}")
    if task in ("sort", "memorization"):
        lines.append(
            "token embedding: the paper maps the embedding sum through one more linear layer "
            "before its LayerNorm; an embedding followed by a linear map is again an embedding, "
            "so probe leaves it out (the same functions, another parametrisation)"
        )
    if task == "sort":
        lines.append(
            "the paper's embedding treats symbol 0 as BERT's padding index, so its embedding "
            "keeps its initial value; probe trains every symbol's embedding"
        )
    if task == "memorization":
        source = "the built-in sample text" if text is None else f"the text {text}"
        lines.append(
            f"data: {source}, cut into windows of {opts.get('tokens')} tokens at seeded random "
            "offsets (overlapping when the text is short), every token of a window a real token; "
            "the paper used RTE's training sentence pairs, padded to 128 tokens, padding masked"
        )
        lines.append(
            "path evaluation: the paper scored paths on its first 11 training batches "
            "(88 sequences); probe scores them on the whole training set"
        )
    if task == "circle" and setup == "strict":
        lines.append(f"`setup` strict: {CIRCLE_WORDS['strict']} (`setup` paper runs theirs)")
    if task != "circle":
        if sub_path:
            lines.append(
                "`sub_path`: each path's term of probe's exact decomposition (normalisation "
                "frozen at the full model's statistics), not the paper's chains of single heads "
                "(leaving out `sub_path` runs theirs)"
            )
        else:
            if path_attention == "full":
                lines.append(
                    "paths use the full model's attention; the paper recomputes each path's "
                    "attention from the path's own state (`path_attention` own)"
                )
            if path_norm == "trained":
                lines.append(
                    "paths use each layer's trained LayerNorm and nothing on their sum; the "
                    "paper normalises each head layer and the sum with LayerNorms without "
                    "scale and shift (`path_norm` paper)"
                )
    return lines


def _paper_hint(task: str, key: str, paper) -> str:
    """The setting that runs the paper's value, named as the parameter of ``run`` (the
    CLI shows its option: ``cli.console.in_cli_words``)."""
    if isinstance(paper, bool):
        if TASKS[task].get(key) == paper:  # the default is the paper's
            return f"leaving out `{key}` runs it"
        return f"`{key}` runs it" if paper else f"no `{key}` runs it"
    return f"`{key}` {show(paper)} runs it"


def show(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _hidden_sizes(value) -> tuple[int, ...]:
    """The circle's hidden sizes: an int, a sequence of ints or text like "32,128"."""
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise ProbeError(f"`hidden` {value!r}: give sizes like 32 or 32,128") from None
    sizes = tuple(int(v) for v in value)
    if not sizes or len(set(sizes)) != len(sizes):
        raise ProbeError("`hidden`: give one or more distinct sizes, like 32,128")
    return sizes
