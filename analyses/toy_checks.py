"""The toy tasks' checks: which path rules apply, every size in its domain, and memory.

``rules`` resolves the path-evaluation rules and the circle's setup of one run
(probe.analyses.toy), refusing the ones that do not apply to its task.  ``check``
puts every setting in its domain through ``probe.requests.checks`` (the CLI's own bounds) and
refuses a run whose upper bound of memory (``run_bytes``: data, training and
evaluation activations, drawn paths, the network with its gradient and Adam's
moments) exceeds the device's (``probe.requests.memory``).
"""

from __future__ import annotations

from collections.abc import Sequence

from probe.errors import ProbeError
from probe.names import PATH_ATTENTIONS, PATH_NORMS, SCHEDULES, TOY_SETUPS
from probe.requests import checks, memory

from .toy_settings import VARIANTS


def rules(task, sub_path, path_attention, path_norm, setup):
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


def check(opts: dict, n_paths: int, repeats: int, device: str = "cpu", task: str = "") -> None:
    """Every size in its domain (``probe.requests.checks``, the CLI's own), then memory."""
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
        run_bytes(task, opts, n_paths, repeats),
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


def run_bytes(task: str, opts: dict, n_paths: int, repeats: int) -> int:
    """An upper bound of what a toy run holds at once (see ``probe.requests.memory``)."""
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
