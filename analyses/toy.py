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
steps; the relative residual of the 2-token matrix (probe.metrics) says whether
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
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from importlib import metadata

import numpy as np
import torch
import xarray as xr

from probe import checks, memory
from probe.errors import ProbeError
from probe.metrics import relative_residual
from probe.names import PATH_ATTENTIONS, PATH_NORMS, SCHEDULES, TOY_SETUPS
from probe.results import utc_now
from probe.toy import ToyConfig, ToySAN
from probe.toy import tasks as data
from probe.toy.train import baselines, path_accuracy, train

Progress = Callable[[int, int, str], None]

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
            lines.append(f"{key} {_show(opts[key])}: the paper's is {_show(paper)} ({hint}){why}")
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
    return f"`{key}` {_show(paper)} runs it"


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


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

    ``path_attention`` (own|full) and ``path_norm`` (paper|trained) choose the rules of
    path-restricted evaluation (default: the paper's, own and paper); they do not apply
    with ``sub_path=True`` nor to the circle.  ``setup`` (paper|strict, default paper)
    applies to the circle only.
    """
    opts = settings(task, quick, **overrides)
    path_attention, path_norm, setup = _rules(task, sub_path, path_attention, path_norm, setup)
    dev = _device(device)
    _check(opts, n_paths, repeats, str(dev), task)
    progress = progress or (lambda done, total, label: None)
    started = time.perf_counter()
    if task == "circle":
        ds = _circle(opts, setup, seed, dev, progress)
    else:
        ds = _path_task(
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
        **{k: _show(v) if isinstance(v, tuple) else v for k, v in opts.items()},
        deviations=json.dumps(gone),
    )
    return ds


def _rules(task, sub_path, path_attention, path_norm, setup):
    """The path rules and circle setup in force, refusing the ones that do not apply."""
    if setup is not None and setup not in TOY_SETUPS:
        raise ProbeError(f"unknown `setup` {setup!r}; choose paper or strict")
    if path_attention is not None and path_attention not in PATH_ATTENTIONS:
        raise ProbeError(f"unknown `path_attention` {path_attention!r}; choose own or full")
    if path_norm is not None and path_norm not in PATH_NORMS:
        raise ProbeError(f"unknown `path_norm` {path_norm!r}; choose paper or trained")
    if task == "circle":
        if path_attention is not None or path_norm is not None:
            raise ProbeError("`path_attention` and `path_norm` apply to the path tasks, not circle")
        return None, None, setup or "paper"
    if setup is not None:
        raise ProbeError("`setup` applies to the circle only")
    if sub_path:
        if path_attention is not None or path_norm is not None:
            raise ProbeError(
                "`path_attention` and `path_norm` choose the rules of chains without `sub_path`; "
                "`sub_path` uses the full model's attention and frozen normalisation"
            )
        return None, None, None
    return path_attention or "own", path_norm or "paper", None


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


def _path_task(
    task, opts, seed, dev, n_paths, repeats, sub_path, path_attention, path_norm, text, progress
) -> xr.Dataset:
    rng_train, rng_eval = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    extra: dict = {}
    shuffle, clip = False, None
    if task == "sort":
        x_tr, y_tr = data.sort_data(opts["train"], opts["length"], opts["symbols"], rng_train)
        x_ev, y_ev = data.sort_data(opts["eval"], opts["length"], opts["symbols"], rng_eval)
        cfg = dict(vocab=opts["symbols"], max_len=opts["length"], n_out=opts["symbols"])
        eval_set = "held-out sequences"
    elif task == "convex-hull":
        args = (opts["points"], opts["box"], opts["shift"])
        x_tr, y_tr = data.hull_data(opts["train"], *args, rng_train)
        x_ev, y_ev = data.hull_data(opts["eval"], *args, rng_eval)
        cfg = dict(in_features=2, n_out=2)
        eval_set = "held-out point sets"
    else:  # memorization: the evaluation set is the training set
        ids = data.text_tokens(data.read_text(text))
        windows, y_tr = data.memorization_data(ids, opts["train"], opts["tokens"], rng_train)
        x_tr, used = data.compact_vocab(windows)
        x_ev, y_ev = x_tr, y_tr
        cfg = dict(vocab=len(used), max_len=opts["tokens"] if opts["positions"] else 0, n_out=2)
        eval_set = "the training set (memorization)"
        # HuggingFace's Trainer, which the paper's memorization runs through: shuffled
        # batches and gradients clipped at norm 1 (its max_grad_norm).
        shuffle, clip = True, 1.0
        extra = {"text": text or "built-in sample text", "text_tokens": len(ids),
                 "vocab_used": len(used)}  # fmt: skip
    torch.manual_seed(seed)
    model = ToySAN(
        ToyConfig(hidden=opts["hidden"], heads=opts["width"], depth=opts["depth"], **cfg)
    ).to(dev)
    x_tr, y_tr, x_ev, y_ev = (torch.as_tensor(a, device=dev) for a in (x_tr, y_tr, x_ev, y_ev))
    epochs = opts["epochs"]
    cells = (opts["depth"] + 1) * repeats
    total = epochs + cells
    t0 = time.perf_counter()
    losses = train(
        model, x_tr, y_tr, epochs=epochs, batch_size=opts["batch_size"], lr=opts["lr"],
        weight_decay=opts["weight_decay"], schedule=opts["schedule"], clip=clip,
        shuffle=shuffle, seed=seed,
        progress=lambda d, _t, label: progress(d, total, label),
    )  # fmt: skip
    train_seconds = time.perf_counter() - t0
    with torch.no_grad():
        full = float((model(x_ev).argmax(-1) == y_ev).double().mean())
    acc, names = path_accuracy(
        model, x_ev, y_ev, n_paths=n_paths, repeats=repeats, seed=seed, sub_path=sub_path,
        attention=path_attention or "full", norm=path_norm or "trained",
        progress=lambda d, _t, label: progress(epochs + d, total, label),
    )  # fmt: skip
    base = baselines(y_tr, y_ev)
    depth = opts["depth"]
    rules = (
        {
            "path_attention": "full (exact decomposition)",
            "path_norm": "frozen (exact decomposition)",
        }
        if sub_path
        else {"path_attention": path_attention, "path_norm": path_norm}
    )
    return xr.Dataset(
        {
            "accuracy": (("path_length", "repeat"), acc),
            "paths": (("path_length", "repeat", "path"), names),
            "train_loss": (("epoch",), losses),
            "full_accuracy": ((), full),
            "baseline_majority": ((), base["majority"]),
            "baseline_position": ((), base["position"]),
        },
        coords={
            "path_length": np.arange(depth + 1),
            "repeat": np.arange(repeats),
            "path": np.arange(n_paths),
            "epoch": np.arange(1, epochs + 1),
        },
        attrs={
            "n_paths": n_paths,
            "repeats": repeats,
            "sub_path": sub_path,
            **rules,
            "eval_set": eval_set,
            "eval_size": int(y_ev.shape[0]),
            "train_seconds": round(train_seconds, 3),
            "parameters": sum(p.numel() for p in model.parameters()),
            "shuffle": shuffle,
            "clip_grad_norm": "none" if clip is None else clip,
            **extra,
        },
    )


def circle_run(model: ToySAN, start: torch.Tensor, steps: int, recurrent_skip: bool) -> np.ndarray:
    """The drawn points (steps + 1, 2, 2) of ``model`` applied to its own output from ``start``.

    Without the recurrent skip: s <- f(s), and s is drawn.  With it (the paper's
    "+skip"): s <- s + f(s), and f(s) is drawn, as ``run_circle.py`` does.  Step 0 is
    the start in both.
    """
    drawn = np.zeros((steps + 1, 2, 2))
    drawn[0] = start.cpu().numpy()
    state = start[None]  # (1, 2, 2): one sequence of two points
    with torch.no_grad():
        for step in range(1, steps + 1):
            out = model(state)
            state = state + out if recurrent_skip else out
            drawn[step] = out[0].cpu().numpy()
    return drawn


def _circle(opts, setup, seed, dev, progress) -> xr.Dataset:
    x, y = (torch.as_tensor(a, device=dev) for a in data.circle_data(opts["points"]))
    steps, epochs, sizes = opts["steps"], opts["epochs"], opts["hidden"]
    cells = [(h, v) for h in sizes for v in VARIANTS]
    total = len(cells) * (epochs + steps)
    traj = np.zeros((len(sizes), len(VARIANTS), steps + 1, 2, 2))
    losses = np.zeros((len(sizes), len(VARIANTS), epochs))
    for n, (hidden, name) in enumerate(cells):
        i, v = divmod(n, len(VARIANTS))
        attn_skip, mlp, recurrent = CIRCLE_NETWORKS[setup][name]
        torch.manual_seed(seed)  # same initial weights where the variants share them
        cfg = ToyConfig(hidden=hidden, heads=opts["width"], depth=opts["depth"], n_out=2,
                        in_features=2, skip=attn_skip, mlp=mlp, embed_mlp=False)  # fmt: skip
        model = ToySAN(cfg).to(dev)
        offset = n * (epochs + steps)
        losses[i, v] = train(
            model, x, y, epochs=epochs, batch_size=opts["batch_size"], lr=opts["lr"],
            weight_decay=opts["weight_decay"], schedule=opts["schedule"],
            loss="squared-error", previous_input=recurrent, seed=seed,
            label=f"hidden {hidden}, {name}: training",
            progress=lambda d, _t, label, offset=offset: progress(offset + d, total, label),
        )  # fmt: skip
        traj[i, v] = circle_run(model, x[0], steps, recurrent)
        progress(offset + epochs + steps, total, f"hidden {hidden}, {name}: recurrent steps")
    flat = torch.as_tensor(traj.reshape(-1, 2, 2))
    rel = relative_residual(flat).reshape(len(sizes), len(VARIANTS), -1)
    return xr.Dataset(
        {
            "trajectory": (("hidden", "variant", "step", "token", "coord"), traj),
            "relative_residual": (("hidden", "variant", "step"), rel.numpy()),
            "train_loss": (("hidden", "variant", "epoch"), losses),
            "circle": (("point", "coord"), data.circle_points(opts["points"]).astype(float)),
        },
        coords={
            "hidden": list(sizes),
            "variant": list(VARIANTS),
            "step": np.arange(steps + 1),
            "token": [0, 1],
            "coord": ["x", "y"],
            "epoch": np.arange(1, epochs + 1),
            "point": np.arange(opts["points"]),
        },
        attrs={
            "setup": setup,
            "variants": CIRCLE_WORDS[setup],
            "residual": "relative residual, l1inf norm, residual to the token mean, of the "
            "drawn points (f(s) for the paper's SAN+skip)",
        },
    )


def _check(opts: dict, n_paths: int, repeats: int, device: str = "cpu", task: str = "") -> None:
    """Every size in its domain (``probe.checks``, the CLI's own), then memory."""
    for key, value in opts.items():
        name = f"`{key}`"
        if isinstance(value, bool | str):
            continue
        if key == "lr":
            checks.real(name, value, 0, MAX_LR, low_open=True)
        elif key in ("shift", "weight_decay", "box"):
            checks.real(name, value, 0, MAX_SHIFT, low_open=key == "box")
        elif key == "hidden":
            for size in value if isinstance(value, Sequence) else (value,):
                checks.integer(name, size, 1)
        elif isinstance(value, int | float):
            checks.integer(name, value, 1)
    for size in opts["hidden"] if isinstance(opts["hidden"], Sequence) else (opts["hidden"],):
        if size % opts["width"]:
            raise ProbeError(f"`hidden` {size} is not a multiple of `width` {opts['width']}")
    if opts.get("schedule", "constant") not in SCHEDULES:
        raise ProbeError(
            f"unknown `schedule` {opts['schedule']!r}; choose from {', '.join(SCHEDULES)}"
        )
    checks.integer("`n_paths`", n_paths, 1)
    checks.integer("`repeats`", repeats, 1)
    memory.require(
        _bytes(task, opts, n_paths, repeats),
        device,
        f"toy {task} with these sizes",
        "use smaller `train`, `eval`, `hidden`, `depth`, `batch_size`, `n_paths` or `repeats`",
    )


#: The largest Adam learning rate and convex-hull shift accepted (the CLI's bounds).
MAX_LR = 1.0
MAX_SHIFT = 1e6
#: The most token ids memorization's embedding can hold (BERT's vocabulary).
TOY_VOCAB_MAX = 30522
#: Activations of one layer kept for the backward pass, in units of batch x length x hidden.
TOY_ACTIVATIONS = 12


def _bytes(task: str, opts: dict, n_paths: int, repeats: int) -> int:
    """An upper bound of what a toy run holds at once (see ``probe.memory``)."""
    hidden, depth, width = opts["hidden"], opts["depth"], opts["width"]
    hidden = max(hidden) if isinstance(hidden, Sequence) else hidden  # the circle's sweep
    if task == "circle":
        length, n_train, n_eval = 2, opts["points"], 0
        extra = len(VARIANTS) * (opts["steps"] + 1) * 4 * 8 + opts["points"] * 2 * 8
    else:
        length = opts.get("length") or opts.get("points") or opts.get("tokens") or 1
        n_train = opts["train"]
        n_eval = opts.get("eval", n_train)
        paths = (depth + 1) * repeats * n_paths
        extra = paths * (depth * 4 + 64)  # the drawn paths as text (numpy strings)
    batch = min(opts["batch_size"], max(n_train, 1))
    data = (n_train + n_eval) * length * 8 * 3  # inputs (points: two floats) and labels
    per_row = TOY_ACTIVATIONS * length * hidden * depth + 3 * width * length * length * depth
    training = batch * per_row * 4
    evaluation = n_eval * (per_row + 2 * length * hidden) * 4  # the full trace, kept, and a path
    # The network: at most 12 hidden^2 weights a layer (attention 4, a 4x MLP 8) and the
    # token embedding (at most BERT's vocabulary), each with its gradient and Adam's two
    # moments, float32.
    vocab = TOY_VOCAB_MAX if task == "memorization" else opts.get("symbols", 2) + length
    network = 16 * (12 * depth * hidden * hidden + (vocab + 64) * hidden)
    return data + training + evaluation + extra + network + opts["epochs"] * 8


def _device(device: str) -> torch.device:
    return torch.device(checks.device(device))


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
