"""The toy tasks' training runs, each as a Dataset: the path tasks and the circle.

``path_task`` trains one network on sort, convex hull or memorization (probe.toy.train)
and evaluates it through random subsets of its paths, beside the full model's accuracy
and the input-blind baselines.  ``circle_task`` trains the circle's networks, each hidden
size and variant from the same seed, and applies each to its own output
(``circle_run``); the relative residual of the drawn points (probe.measures.metrics) says
whether the two points merge.  The settings come resolved and checked from
probe.analyses.toy; see its docstring for the method.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import xarray as xr

from probe.measures.metrics import relative_residual
from probe.toy import ToyConfig, ToySAN
from probe.toy import tasks as data
from probe.toy.train import baselines, path_accuracy, train

from .toy_settings import CIRCLE_NETWORKS, CIRCLE_WORDS, VARIANTS


def path_task(
    task, opts, seed, dev, n_paths, repeats, sub_path, path_attention, path_norm, text, progress
) -> xr.Dataset:
    rng_train, rng_eval = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    arrays, cfg, setup = _task_data(task, opts, text, rng_train, rng_eval)
    torch.manual_seed(seed)
    model = ToySAN(
        ToyConfig(hidden=opts["hidden"], heads=opts["width"], depth=opts["depth"], **cfg)
    ).to(dev)
    x_tr, y_tr, x_ev, y_ev = (torch.as_tensor(a, device=dev) for a in arrays)
    epochs = opts["epochs"]
    cells = (opts["depth"] + 1) * repeats
    total = epochs + cells
    t0 = time.perf_counter()
    losses = train(
        model, x_tr, y_tr, epochs=epochs, batch_size=opts["batch_size"], lr=opts["lr"],
        weight_decay=opts["weight_decay"], schedule=opts["schedule"], clip=setup["clip"],
        shuffle=setup["shuffle"], seed=seed,
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
    attrs = _path_attrs(
        setup, model, y_ev, train_seconds, n_paths, repeats, sub_path, path_attention, path_norm
    )
    return _path_dataset(acc, names, losses, full, base, opts["depth"], epochs, attrs)


def _task_data(task, opts, text, rng_train, rng_eval) -> tuple[tuple, dict, dict]:
    """The task's (x_tr, y_tr, x_ev, y_ev), the network's task settings and the training's.

    The training settings: ``eval_set`` (in words), ``shuffle``, ``clip`` (the gradient
    norm, None: no clipping) and ``extra`` (attributes only memorization has).
    """
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
    setup = {"eval_set": eval_set, "shuffle": shuffle, "clip": clip, "extra": extra}
    return (x_tr, y_tr, x_ev, y_ev), cfg, setup


def _path_attrs(
    setup, model, y_ev, train_seconds, n_paths, repeats, sub_path, path_attention, path_norm
) -> dict:
    """The path task's attributes: how its paths were drawn and how the network was trained."""
    rules = (
        {
            "path_attention": "full (exact decomposition)",
            "path_norm": "frozen (exact decomposition)",
        }
        if sub_path
        else {"path_attention": path_attention, "path_norm": path_norm}
    )
    return {
        "n_paths": n_paths,
        "repeats": repeats,
        "sub_path": sub_path,
        **rules,
        "eval_set": setup["eval_set"],
        "eval_size": int(y_ev.shape[0]),
        "train_seconds": round(train_seconds, 3),
        "parameters": sum(p.numel() for p in model.parameters()),
        "shuffle": setup["shuffle"],
        "clip_grad_norm": "none" if setup["clip"] is None else setup["clip"],
        **setup["extra"],
    }


def _path_dataset(acc, names, losses, full, base, depth, epochs, attrs) -> xr.Dataset:
    """The path task's Dataset: ``attrs`` holds ``n_paths`` and ``repeats`` among the rest."""
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
            "repeat": np.arange(attrs["repeats"]),
            "path": np.arange(attrs["n_paths"]),
            "epoch": np.arange(1, epochs + 1),
        },
        attrs=attrs,
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


def circle_task(opts, setup, seed, dev, progress) -> xr.Dataset:
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
