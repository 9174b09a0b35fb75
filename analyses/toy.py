"""The paper's trained experiments as Datasets: sort, convex hull, memorization, circle.

Dong, Cordonnier & Loukas (2021), Section 4, train small post-LN self-attention
networks (probe.toy.model) and evaluate them through random subsets of their
paths: for each length k = 0..L, ``n_paths`` uniform paths of length k, summed,
``repeats`` times.  Short paths carrying most of the accuracy is the claim.  The
full model's accuracy and the input-blind baselines are measured on the same
evaluation set.  The circle experiment trains a one-layer network to move two
points one step along two arcs of a circle, then applies it to its own output
for ``steps`` steps: pure attention collapses the two points into one, a skip
connection or an MLP keeps them apart; the relative residual of the 2-token
matrix (probe.metrics) measures it.

``run(task, **options)`` returns the Dataset; ``TASKS`` holds the paper's
defaults and ``QUICK`` the reduced sizes of ``--quick``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import metadata

import numpy as np
import torch
import xarray as xr

from probe import checks, memory
from probe.errors import ProbeError
from probe.metrics import relative_residual
from probe.results import utc_now
from probe.toy import ToyConfig, ToySAN
from probe.toy import tasks as data
from probe.toy.train import baselines, path_accuracy, train

Progress = Callable[[int, int, str], None]

#: The paper's settings (its README's commands; batch size 30, Adam).  lr is probe's
#: choice where the paper's 1e-5 does not train within the paper's epochs (see README).
TASKS: dict[str, dict] = {
    "sort": dict(width=2, depth=6, hidden=48, train=1000, eval=200, epochs=65, lr=1e-3,
                 batch_size=30, length=8, symbols=10),
    "convex-hull": dict(width=3, depth=6, hidden=84, train=10000, eval=300, epochs=70, lr=1e-3,
                        batch_size=30, points=10, shift=1.0),
    "memorization": dict(width=2, depth=6, hidden=250, train=500, epochs=50, lr=3e-4,
                         batch_size=8, tokens=128),
    "circle": dict(width=2, depth=1, hidden=32, points=1000, steps=300, epochs=70, lr=1e-3,
                   batch_size=30),
}  # fmt: skip

#: --quick: the same experiment at a size that runs in well under a minute on one core.
QUICK: dict[str, dict] = {
    "sort": dict(train=300, eval=100, epochs=12),
    "convex-hull": dict(train=400, eval=100, epochs=6),
    "memorization": dict(train=24, tokens=32, hidden=64, epochs=12),
    "circle": dict(points=200, steps=60, epochs=10),
}

VARIANTS = ("SAN", "SAN+skip", "SAN+MLP")  # the circle's networks, in the paper's names


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
    return chosen


def run(
    task: str,
    *,
    seed: int = 0,
    device: str = "cpu",
    quick: bool = False,
    n_paths: int = 5,
    repeats: int = 5,
    sub_path: bool = False,
    text: str | None = None,
    progress: Progress | None = None,
    command: str = "",
    **overrides,
) -> xr.Dataset:
    """Train and evaluate one task; see the module docstring."""
    opts = settings(task, quick, **overrides)
    dev = _device(device)
    _check(opts, n_paths, repeats, str(dev), task)
    progress = progress or (lambda done, total, label: None)
    started = time.perf_counter()
    if task == "circle":
        ds = _circle(opts, seed, dev, progress)
    else:
        ds = _path_task(task, opts, seed, dev, n_paths, repeats, sub_path, text, progress)
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
        **{k: v for k, v in opts.items()},
    )
    return ds


def _path_task(task, opts, seed, dev, n_paths, repeats, sub_path, text, progress) -> xr.Dataset:
    rng_train, rng_eval = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    extra: dict = {}
    if task == "sort":
        x_tr, y_tr = data.sort_data(opts["train"], opts["length"], opts["symbols"], rng_train)
        x_ev, y_ev = data.sort_data(opts["eval"], opts["length"], opts["symbols"], rng_eval)
        cfg = dict(vocab=opts["symbols"], max_len=opts["length"], n_out=opts["symbols"])
        eval_set = "held-out sequences"
    elif task == "convex-hull":
        x_tr, y_tr = data.hull_data(opts["train"], opts["points"], opts["shift"], rng_train)
        x_ev, y_ev = data.hull_data(opts["eval"], opts["points"], opts["shift"], rng_eval)
        cfg = dict(in_features=2, n_out=2)
        eval_set = "held-out point sets"
    else:  # memorization: the evaluation set is the training set
        ids = data.text_tokens(data.read_text(text))
        windows, y_tr = data.memorization_data(ids, opts["train"], opts["tokens"], rng_train)
        x_tr, used = data.compact_vocab(windows)
        x_ev, y_ev = x_tr, y_tr
        cfg = dict(vocab=len(used), max_len=opts["tokens"], n_out=2)
        eval_set = "the training set (memorization)"
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
        progress=lambda d, _t, label: progress(d, total, label),
    )  # fmt: skip
    train_seconds = time.perf_counter() - t0
    with torch.no_grad():
        full = float((model(x_ev).argmax(-1) == y_ev).double().mean())
    acc, names = path_accuracy(
        model, x_ev, y_ev, n_paths=n_paths, repeats=repeats, seed=seed, sub_path=sub_path,
        progress=lambda d, _t, label: progress(epochs + d, total, label),
    )  # fmt: skip
    base = baselines(y_tr, y_ev)
    depth = opts["depth"]
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
            "eval_set": eval_set,
            "eval_size": int(y_ev.shape[0]),
            "train_seconds": round(train_seconds, 3),
            "parameters": sum(p.numel() for p in model.parameters()),
            **extra,
        },
    )


def _circle(opts, seed, dev, progress) -> xr.Dataset:
    x, y = (torch.as_tensor(a, device=dev) for a in data.circle_data(opts["points"]))
    steps, epochs = opts["steps"], opts["epochs"]
    flags = {"SAN": (False, False), "SAN+skip": (True, False), "SAN+MLP": (False, True)}
    total = len(VARIANTS) * (epochs + steps)
    traj = np.zeros((len(VARIANTS), steps + 1, 2, 2))
    losses = np.zeros((len(VARIANTS), epochs))
    for v, name in enumerate(VARIANTS):
        skip, mlp = flags[name]
        torch.manual_seed(seed)  # same initial weights where the variants share them
        cfg = ToyConfig(hidden=opts["hidden"], heads=opts["width"], depth=opts["depth"],
                        n_out=2, in_features=2, skip=skip, mlp=mlp, embed_mlp=False)  # fmt: skip
        model = ToySAN(cfg).to(dev)
        offset = v * (epochs + steps)
        losses[v] = train(
            model, x, y, epochs=epochs, batch_size=opts["batch_size"], lr=opts["lr"],
            loss="squared-error", label=f"{name}: training",
            progress=lambda d, _t, label, offset=offset: progress(offset + d, total, label),
        )  # fmt: skip
        state = x[:1]  # the start points: one on each arc
        traj[v, 0] = state[0].cpu().numpy()
        with torch.no_grad():
            for step in range(1, steps + 1):
                state = model(state)  # the network applied to its own output
                traj[v, step] = state[0].cpu().numpy()
                progress(offset + epochs + step, total, f"{name}: recurrent steps")
    rel = relative_residual(torch.as_tensor(traj.reshape(-1, 2, 2))).reshape(len(VARIANTS), -1)
    return xr.Dataset(
        {
            "trajectory": (("variant", "step", "token", "coord"), traj),
            "relative_residual": (("variant", "step"), rel.numpy()),
            "train_loss": (("variant", "epoch"), losses),
            "circle": (("point", "coord"), data.circle_points(opts["points"]).astype(float)),
        },
        coords={
            "variant": list(VARIANTS),
            "step": np.arange(steps + 1),
            "token": [0, 1],
            "coord": ["x", "y"],
            "epoch": np.arange(1, epochs + 1),
            "point": np.arange(opts["points"]),
        },
        attrs={"residual": "relative residual, l1inf norm, residual to the token mean"},
    )


def _check(opts: dict, n_paths: int, repeats: int, device: str = "cpu", task: str = "") -> None:
    """Every size in its domain (``probe.checks``, the CLI's own), then memory."""
    for key, value in opts.items():
        if key == "lr":
            checks.real("--lr", value, 0, MAX_LR, low_open=True)
        elif key == "shift":
            checks.real("--shift", value, 0, MAX_SHIFT)
        elif isinstance(value, int | float):
            checks.integer(f"--{key.replace('_', '-')}", value, 1)
    if opts["hidden"] % opts["width"]:
        raise ProbeError(f"--hidden {opts['hidden']} is not a multiple of --width {opts['width']}")
    checks.integer("--n-paths", n_paths, 1)
    checks.integer("--repeats", repeats, 1)
    memory.require(
        _bytes(task, opts, n_paths, repeats),
        device,
        f"toy {task} with these sizes",
        "use smaller --train, --eval, --hidden, --depth, --batch-size, --n-paths or --repeats",
    )


#: The largest Adam learning rate and convex-hull shift accepted (the CLI's bounds).
MAX_LR = 1.0
MAX_SHIFT = 1e6
#: Activations of one layer kept for the backward pass, in units of batch x length x hidden.
TOY_ACTIVATIONS = 12


def _bytes(task: str, opts: dict, n_paths: int, repeats: int) -> int:
    """An upper bound of what a toy run holds at once (see ``probe.memory``)."""
    hidden, depth, width = opts["hidden"], opts["depth"], opts["width"]
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
    return data + training + evaluation + extra + opts["epochs"] * 8


def _device(device: str) -> torch.device:
    return torch.device(checks.device(device))


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
