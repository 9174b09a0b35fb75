"""How a collapse run measures: batch by batch, the per-layer reduction inside the trace.

For every batch, each variant and init runs once (``probe.surgery.trace.layer_values``) with a
reducer that turns each layer's token matrix into per-sequence metrics right there
(:mod:`probe.measures.metrics`), so only per-sequence numbers leave the model.  The embeddings'
X_0 is the same for every variant, so its metrics are computed once per batch and model.

On CUDA the layer loop never waits for the device: it only keeps a copy of each layer;
once a batch's forwards are queued, a worker thread measures its layers on a side stream
(overlapping the next batch's forwards) and copies the numbers to pinned host memory.  On a
CPU each layer is measured at once.  The run's first batch also measures the theory panel's
residual norms (``probe.measures.theory.residual_norms``) for SAN, SAN+MLP and SAN+skip.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from probe.loading import ProbedModel
from probe.measures import metrics, theory
from probe.measures.overflow import check_finite, check_nonzero, has_zero_sequence
from probe.names import METRICS, stored
from probe.requests.inputs import Encoded
from probe.surgery.ablate import PRESETS, Ablation
from probe.surgery.masks import Mask
from probe.surgery.trace import layer_values

Progress = Callable[[int, int, str], None]
"""A progress callback: called with (forward passes done, forward passes in all, a label)."""

#: The metrics a run computes unless told otherwise: all of them (the effective rank by the
#: method that fits the size, see probe.measures.metrics).
DEFAULT_METRICS: tuple[str, ...] = METRICS


@dataclass
class Plan:
    """Everything a collapse run needs, checked and loaded, before any forward pass.

    Made by [`collapse.prepare`][probe.analyses.collapse.prepare] and run by
    [`collapse.execute`][probe.analyses.collapse.execute].

    Parameters
    ----------
    models
        The loaded models, one per init.
    variants
        The variants run, in canonical order.
    inputs
        The encoded inputs every model reads.
    surgery
        `"probe"` or `"paper"`.
    batch_size
        Sequences per forward pass.
    command
        The command line that made the run ("" for a library call; a description of the
        call for a model passed as an object).
    settings
        What identifies the run (model, inits, variants, sizes, dtype, ...), recorded in
        the result's `settings` attribute.
    metrics
        The metrics computed.
    effective_rank
        The effective-rank method as resolved for this size: `"exact"` or `"estimate"`.
    removals
        (variant, model index) -> the removal variant with what its clean run found
        (`probe.surgery.removals`), filled in by `collapse.execute` before the first batch.
    branch_scale
        alpha of residual branch scaling at the model's depth (`probe.surgery.scaling`); 1: none.
    request
        The request as data (`probe.requests.request.record`), which the result records; "" for a
        model passed as an object.
    mask
        The attention mask every layer runs with (`probe.surgery.masks`); the model's own by
        default.
    """

    models: list[ProbedModel]
    variants: list[str]
    inputs: Encoded
    surgery: str
    batch_size: int
    command: str
    settings: dict = field(default_factory=dict)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    effective_rank: str = "exact"  # as resolved from what was asked: exact or estimate
    #: (variant, model index) -> the removal variant with what its clean run found
    #: (``probe.surgery.removals``), filled in by ``collapse.execute`` before the first batch.
    removals: dict = field(default_factory=dict)
    #: alpha of residual branch scaling at the model's depth (:mod:`probe.surgery.scaling`); 1: none.
    branch_scale: float = 1.0
    #: The request as data (``probe.requests.request.record``); "" for a model passed as an object.
    request: str = ""
    #: The attention mask every layer runs with (:mod:`probe.surgery.masks`).
    mask: Mask = field(default_factory=Mask)

    def ablation(self, variant: str) -> Ablation:
        """The variant's ablation under this run's surgery and branch scale."""
        preset = PRESETS[variant].with_surgery(self.surgery)
        if self.branch_scale == 1:
            return preset
        return replace(preset, branch_scale=self.branch_scale)

    @property
    def steps(self) -> int:
        """Forward passes the run makes (variants x inits x batches), for progress bars."""
        return self.steps_of((0, 1))

    def steps_of(self, part: tuple[int, int]) -> int:
        """Forward passes of one part ``(rank, world_size)`` of a data-parallel run."""
        from probe.distributed import shard

        start, stop = shard(-(-self.inputs.sequences // self.batch_size), *part)
        return len(self.variants) * len(self.models) * (stop - start)


def empty(plan: Plan, sequences: int) -> dict[str, np.ndarray]:
    shape = (len(plan.variants), len(plan.models), plan.models[0].n_layers + 1, sequences)
    sizes = {"relative_residual": (len(metrics.FITS), len(metrics.NORMS))}
    return {name: np.full(shape + sizes.get(name, ()), np.nan) for name in stored(plan.metrics)}


def pipelined(plan: Plan) -> bool:
    """Whether the run measures on a side stream while the next batch runs (on CUDA)."""
    return plan.models[0].device.type == "cuda"


def blocks(plan: Plan, batches, progress: Progress | None, part: tuple[int, int] = (0, 1)):
    """(first sequence, results) of ``batches``: every variant and init of a batch at once.

    On a CPU each layer is measured as it comes out of the trace.  On CUDA the layer loop
    only keeps each layer's hidden states; once a batch's forwards are queued its layers are
    measured on a side stream by a worker thread, while the next batch's forwards run, and
    the batch's results are read (the only wait) just before the one after it starts."""
    cuda = pipelined(plan)
    worker = ThreadPoolExecutor(1, thread_name_prefix="probe-metrics") if cuda else None
    done = [0]
    pending = None  # (start, future) of the batch being measured on CUDA
    try:
        for start, ids, mask in batches:
            # The run's first batch also measures the theory panel's sequences.
            panel = min(ids.shape[0], theory.PANEL_SEQUENCES) if start == 0 else 0
            runs = _run_batch(plan, ids, mask, progress, done, plan.steps_of(part), panel)
            if worker is None:
                yield start, *_block(plan, ids.shape[0], runs)
                continue
            ready = torch.cuda.Event()
            # the batch's forwards, as queued on the model device's current stream
            ready.record(torch.cuda.current_stream(plan.models[0].device))
            future = worker.submit(_measure_cuda, plan, ids.shape[0], runs, ready)
            if pending is not None:
                yield pending[0], *pending[1].result()
            pending = (start, future)
        if pending is not None:
            yield pending[0], *pending[1].result()
    finally:
        if worker is not None:
            worker.shutdown(wait=True)


def _run_batch(
    plan: Plan, ids, mask, progress: Progress | None, done: list[int], steps: int, panel: int = 0
) -> list:
    """Every variant and init of one batch: [(variant, init, per-layer values, panel)].

    ``panel``: for SAN, SAN+MLP and SAN+skip, also measure the theory panel's residual norms
    of the first ``panel`` sequences (``theory.residual_norms``), so the panel needs no
    forward passes of its own."""
    L = plan.models[0].n_layers
    cuda = pipelined(plan)
    # X_0 is shared by a model's variants: one reducer per model keeps its metrics.
    reducers = [Reducer(L + 1, plan, cuda) for _ in plan.models]
    runs = []
    for i, variant in enumerate(plan.variants):
        preset = plan.ablation(variant)
        # The theory panel's bounds are of the unscaled model: no residuals for it here.
        tap = panel if variant in theory.PANEL_VARIANTS and plan.surgery == "probe" else 0
        tap = tap if plan.branch_scale == 1 else 0
        for j, probed in enumerate(plan.models):
            ablation = plan.removals.get((variant, j), preset)
            reducers[j].panel = tap
            reducers[j].scope = _scope(plan, i, j)
            runs.append((i, j, layer_values(probed, ids, ablation, reducers[j], mask), tap))
            done[0] += 1
            if progress is not None:
                progress(done[0], steps, f"{probed.name} · {probed.init} · {variant}")
    return runs


#: The key under which a layer's values carry the theory panel's residual norms.
PANEL = "theory_panel"


def _block(plan: Plan, sequences: int, runs: list) -> tuple[dict[str, np.ndarray], list | None]:
    """A batch's results, and per model the theory panel's (layer, sequence) residuals by
    variant (None when the batch measured none)."""
    block = empty(plan, sequences)
    panel: list[dict[str, np.ndarray]] = [{} for _ in plan.models]
    for i, j, per_layer, _ in runs:
        for layer, values in enumerate(per_layer):
            for name, value in values.items():
                if name != PANEL:
                    block[name][i, j, layer] = value.numpy()
        if PANEL in per_layer[0]:
            panel[j][plan.variants[i]] = np.stack([v[PANEL].numpy() for v in per_layer])
    return block, panel if any(panel) else None


def _measure_cuda(plan: Plan, sequences: int, runs: list, ready) -> dict[str, np.ndarray]:
    """A CUDA batch's metrics, on a side stream once its forwards are done (worker thread).

    Every layer of every variant and init is measured together (``measure_layers``), in a
    few large calls instead of one small one per layer: each call's fixed cost -- its waits
    for the device, its small eigenproblems on the host -- is then paid a few times per
    batch, not once per layer.  The values are copied into pinned host memory without
    blocking; the one wait is at the end, for the whole batch, off the thread that queues
    the forwards."""
    device = plan.models[0].device
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        side.wait_event(ready)
        layers = [layer for _, _, per_layer, _ in runs for layer in per_layer]
        # Per layer: all finite, and no sequence all zero; both read back in one wait.
        flags = [(torch.isfinite(x).all(), has_zero_sequence(x, real)) for x, real in layers]
        flags = torch.stack([torch.stack(f) for f in flags]).cpu()
        for index in torch.nonzero(~flags[:, 0] | flags[:, 1]).flatten().tolist():
            x, real = layers[index]
            i, j, per_layer, _ = runs[index // len(runs[0][2])]
            # raises where real tokens overflowed, or are all zero in a sequence
            check_finite(x, real, index % len(per_layer), *_scope(plan, i, j))
            check_nonzero(x, real, index % len(per_layer), *_scope(plan, i, j)[:2])
        values = iter(measure_layers(layers, plan.metrics, plan.effective_rank, _to_host))
        measured = []
        for i, j, per_layer, tap in runs:
            measured.append((i, j, [next(values) for _ in per_layer], tap))
            if tap:
                for (x, real), host in zip(per_layer, measured[-1][2], strict=True):
                    host[PANEL] = _to_host(theory.residual_norms(x[:tap], real[:tap]))
    side.synchronize()
    return _block(plan, sequences, measured)


#: Bytes of float64 work one metrics call of ``measure_layers`` may take (the hidden states,
#: the Gram matrices and the Krylov bases of its sequences), so that measuring many layers
#: at once stays within a small share of the device's memory.
MEASURE_BYTES = 2 * 2**30


def _scope(plan: Plan, i: int, j: int) -> tuple[str, str, bool]:
    """``check_finite``'s where, what and scaled for variant ``i`` of model ``j``."""
    probed = plan.models[j]
    where = f"{probed.name} ({probed.init}, {plan.variants[i]})"
    return where, "token representations", plan.branch_scale != 1


def measure_layers(layers: list, chosen, method: str, to_host=None) -> list[dict]:
    """The metrics of many layers' ``(x, mask)`` (``metrics.collapse_metrics``), as one dict a
    layer, computed in as few calls as ``MEASURE_BYTES`` allows.

    Layers of the same token and hidden sizes and dtype are concatenated along the sequence
    axis; every metric is per sequence (each sequence's numbers do not depend on the others
    in its call), so the values are those of one call a layer.  ``to_host``, where given,
    is applied once to each call's values before they are split into layers."""
    out: list[dict | None] = [None] * len(layers)
    groups: dict[tuple, list[int]] = {}
    for index, (x, _) in enumerate(layers):
        groups.setdefault((tuple(x.shape[1:]), x.dtype), []).append(index)
    for (shape, _), members in groups.items():
        tokens, hidden = shape
        k = min(tokens, hidden)
        per_sequence = 8 * (tokens * hidden + k * k + 8 * 128 * k)
        rows = max(1, MEASURE_BYTES // per_sequence)
        chunks: list[list[int]] = [[]]
        filled = 0  # sequences in the last chunk
        for index in members:
            count = len(layers[index][0])
            if chunks[-1] and filled + count > rows:
                chunks.append([])
                filled = 0
            chunks[-1].append(index)
            filled += count
        for chunk in chunks:
            X = torch.cat([layers[i][0] for i in chunk])
            mask = torch.cat([layers[i][1] for i in chunk])
            values = metrics.collapse_metrics(X, mask, chosen, method)
            if to_host is not None:
                values = {name: to_host(value) for name, value in values.items()}
            sizes = [len(layers[i][0]) for i in chunk]
            parts = {name: value.split(sizes) for name, value in values.items()}
            for n, i in enumerate(chunk):
                out[i] = {name: part[n] for name, part in parts.items()}
    return out  # type: ignore[return-value]


def _to_host(value: torch.Tensor) -> torch.Tensor:
    """A non-blocking copy into pinned host memory (readable once the stream is synced)."""
    host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
    return host.copy_(value, non_blocking=True)


class Reducer:
    """The per-layer reduction inside the trace: only per-sequence numbers leave the model.

    The stream starts at the embeddings X_0, which no ablation touches, so one reducer serves
    all the variants of a batch and model: on a CPU X_0's metrics are computed once and reused
    for as long as X_0 is exactly the same tensor (checked, never assumed).  On CUDA the
    reducer keeps a copy of the layer (queued on the device, no wait) for ``_measure_cuda``.
    """

    def __init__(self, layers: int, plan: Plan, cuda: bool) -> None:
        self.layers = layers
        self.metrics, self.method = plan.metrics, plan.effective_rank
        self.cuda = cuda
        self.calls = 0
        self.first: tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]] | None = None
        #: Sequences whose theory-panel residual this trace also measures (0: none).
        self.panel = 0
        #: (where, what, scaled) of ``check_finite``: the model, init and variant traced.
        self.scope: tuple = ()

    def __call__(self, x: torch.Tensor, mask: torch.Tensor):
        layer, self.calls = self.calls % self.layers, self.calls + 1
        if self.cuda:  # a copy: the forward may reuse the tensor's memory
            return x.detach().clone(), mask.clone()
        values = None
        if layer == 0 and self.first is not None:
            x0, mask0, cached = self.first
            if torch.equal(x, x0) and torch.equal(mask, mask0):
                values = cached
        if values is None:
            check_finite(x, mask, layer, *self.scope)
            check_nonzero(x, mask, layer, *self.scope[:2])
            values = metrics.collapse_metrics(x, mask, self.metrics, self.method)
            values = {name: value.cpu() for name, value in values.items()}
            if layer == 0:
                self.first = (x.clone(), mask.clone(), values)
        if self.panel:
            n = self.panel
            values = {**values, PANEL: theory.residual_norms(x[:n], mask[:n]).cpu()}
        return values
