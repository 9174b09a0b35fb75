"""What the layer-level benchmarks share: a timer that waits for CUDA, the interleaved
medians of several runs, and a random-init model cut to its first layers.

Run the benchmarks as scripts (``python benchmarks/attention.py``): this folder is then
first on ``sys.path`` and ``import timing`` finds this module.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

import probe


def timed(fn, device) -> float:
    """Seconds ``fn()`` takes, the device's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def interleaved_medians(runs: dict, repeats: int, device) -> dict[str, float]:
    """Each run once to warm up (nnsight wraps the model, allocators settle), then all of
    them in turn ``repeats`` times, so that machine noise hits them alike; the medians."""
    for fn in runs.values():
        fn()
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn, device))
    return {name: statistics.median(values) for name, values in times.items()}


def collapse_pair(probed, inputs, batch: int, metrics: str = "all"):
    """(forwards, analysis) of a collapse run, to time one against the other: every batch of
    ``inputs`` under the four ablations (SAN, SAN+MLP, SAN+skip, transformer) through
    ``layer_values`` with the trivial reduction, so the residual stream X_0 .. X_L is
    captured and nothing else computed; and ``collapse.run`` on the same model, inputs and
    batches, all four variants and ``metrics``, Dataset included."""
    from probe.analyses import collapse
    from probe.surgery.ablate import PRESETS, parse_variants
    from probe.surgery.trace import capture, layer_values

    batches = [(ids, mask) for _, ids, mask in inputs.batches(batch)]
    variants = parse_variants("all")

    def forwards():
        for variant in variants:
            for ids, mask in batches:
                layer_values(probed, ids, PRESETS[variant], capture, mask)

    def analysis():
        collapse.run(probed, variants="all", init="random", sequences=inputs.sequences,
                     tokens=inputs.tokens, seed=0, batch_size=batch, metrics=metrics)  # fmt: skip

    return forwards, analysis


def random_model(name: str, layers: int | None, device: str):
    """``name`` at random init; with ``layers``, its shipped config cut to that many."""
    if layers is None:
        return probe.load(name, init="random", device=device)
    from transformers import AutoConfig, AutoModel

    from probe.loading import bundled_configs

    config = AutoConfig.for_model(**json.loads(bundled_configs()[name].read_text()))
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager")
    return probe.wrap(model, name=name, init="random", device=device)
