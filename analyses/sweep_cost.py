"""What each point of a sweep will cost, before any runs: memory, time, and a valid config.

Every point's config is read and checked the way loading checks it
(:func:`probe.loading.resolve.check_config`: heads dividing the width, positive sizes, a
model transformers can build, on the meta device), so a point the config rejects is refused
by name before the first point runs.  From that config:

* memory: the weights (parameters x element size, float32 while loading) plus
  :func:`probe.requests.memory.forward_bytes` of one batch and the inputs, plus, for ``probe
  attention``'s statistics, the float64 probabilities of one layer (three copies);
* time: the forward passes' floating-point work, 2 x parameters x tokens per sequence
  (the matrix products) plus 4 x layers x tokens^2 x width (attention scores and their
  product with the values), for every variant and init, and once more per init for the
  attention statistics, divided by the rate of a float32 matrix product measured here
  (:func:`matmul_rate`).  A lower bound: the metrics, the walker's hooks and the loading
  are not counted; on small models they dominate.
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass

from probe.errors import ProbeError
from probe.requests import memory

from .sweep_points import Point


@dataclass(frozen=True)
class Cost:
    """One point's estimate: bytes held at once and seconds of forward passes."""

    bytes: int
    seconds: float
    parameters: int


def point_config(model, source: str):
    """The config a point runs: the model's (or the step folder's) at its revision, with its
    overrides; a revision not to be had offline, a key the config lacks or a value of the
    wrong type raise ProbeError here, before any point runs."""
    from probe.loading.resolve import config_at, locate

    location, _ = locate(source)
    revision = getattr(model, "revision", None)
    if revision is not None:
        from probe.loading.resolve import check_revision

        check_revision(source, location, revision)
        config = config_at(source, location, prefer_bundled=False, revision=revision)
    else:
        config = config_at(source, location, prefer_bundled=model.init == ("random",))
    overrides = getattr(model, "config", None)
    if overrides:
        from probe.loading.config_edits import apply_overrides

        config = apply_overrides(source, copy.deepcopy(config), overrides)
    return config


@functools.cache
def matmul_rate() -> float:
    """Float32 multiply-adds per second of a 512 x 512 matrix product here (x2: FLOP/s)."""
    import torch

    a = torch.ones(512, 512)
    a @ a  # warm up
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < 0.05:
        a @ a
        runs += 1
    return 2 * 512**3 * runs / (time.perf_counter() - start)


def estimate(sweep, point: Point, cache: dict | None = None) -> Cost:
    """The point's :class:`Cost`; a config it cannot run raises ProbeError."""
    from probe.loading.resolve import check_config
    from probe.models import adapter_for

    from .sweep import point_request

    model, inputs, options = point_request(sweep, point)
    source = str(model.source)
    key = (source, repr(sorted((getattr(model, "config", None) or {}).items())))
    if cache is not None and key in cache:
        config, adapter, params = cache[key]
    else:
        config = point_config(model, source)
        try:
            adapter = adapter_for(config.model_type)
        except (KeyError, ProbeError):
            raise ProbeError(f"probe has no family for model_type {config.model_type}") from None
        params = check_config(source, config, adapter)
        if cache is not None:
            cache[key] = (config, adapter, params)
    sequences = inputs.sequences if isinstance(inputs.sequences, int) else 32
    tokens, batch = inputs.tokens or 128, min(inputs.batch_size or 16, sequences)
    hidden, heads = adapter.hidden_size(config), adapter.n_heads(config)
    layers = adapter.n_layers(config)
    itemsize = {"float64": 8, "float16": 2, "bfloat16": 2}.get(model.dtype or "", 4)
    intermediate = next((getattr(config, k) for k in ("intermediate_size", "n_inner", "d_inner")
                         if isinstance(getattr(config, k, None), int)), 0)  # fmt: skip
    held = params * max(itemsize, 4) + memory.inputs_bytes(sequences, tokens)
    held += memory.forward_bytes(batch, tokens, hidden, heads, itemsize, intermediate)
    if sweep.attention:
        held += 3 * batch * heads * tokens * tokens * 8
    variants = options.get("variants", "all")
    runs = 4 if variants == "all" else len(str(variants).split(","))
    passes = len(model.init) * (runs + (1 if sweep.attention else 0))
    # The token embedding is a lookup, not a product: its vocab x hidden parameters cost no
    # multiply-adds (they are most of a small-depth Llama's), so the count leaves them out.
    vocab = getattr(config, "vocab_size", 0)
    products = max(params - (vocab if isinstance(vocab, int) else 0) * hidden, 0)
    flops = passes * sequences * (2 * products * tokens + 4 * layers * tokens**2 * hidden)
    return Cost(int(held), flops / matmul_rate(), params)


def costs(sweep) -> list[Cost]:
    """Every point's cost, each config read once; the first bad point is named."""
    cache: dict = {}
    found = []
    for point in sweep.points:
        try:
            found.append(estimate(sweep, point, cache))
        except ProbeError as err:
            raise ProbeError(f"point {point.label()}: {err}") from None
    return found


def require(sweep, found: list[Cost], max_hours: float | None = None) -> None:
    """Refuse a sweep whose largest point does not fit the device's free memory, or whose
    forward passes alone take longer than ``max_hours`` (the estimate is a lower bound, so a
    sweep refused here could not have finished in time)."""
    if max_hours is not None:
        total = sum(cost.seconds for cost in found)
        if total > max_hours * 3600:
            raise ProbeError(
                f"the grid's {len(found)} points take at least {total / 3600:.2g} h of forward "
                f"passes at this machine's matrix-product rate, more than `max_hours` "
                f"{max_hours:g}; raise it or sweep fewer or smaller points"
            )
    worst = max(range(len(found)), key=lambda i: found[i].bytes)
    point = sweep.points[worst]
    memory.require(
        found[worst].bytes,
        str(sweep.model.device or "cpu"),
        f"point {point.label()}",
        "sweep smaller values, fewer `sequences`, `tokens` or a smaller `batch_size`",
    )
