"""Rank collapse along depth (Dong, Cordonnier & Loukas 2021, Section 4 and Fig. 2).

For every variant (SAN, SAN+MLP, SAN+skip, transformer) and init (pretrained,
random), run the model under that ablation and measure, at every layer l = 0..L
and for every sequence, how close the token matrix X_l is to rank one:

    r_l = ||res(X_l)||_{1,inf} / ||X_l||_{1,inf},    res(X) = X - 1 x^T,

with x the token mean (the paper's notebook) or the best rank-one fit, in
several norms, together with effective rank, stable rank and token cosine
similarity.  The paper shows r_l falling doubly exponentially for a pure
attention network and staying away from 0 when skip connections are kept.

Metrics are computed inside the trace, layer by layer, so only per-sequence
numbers leave the model.  ``metrics=`` chooses which (:data:`DEFAULT_METRICS`:
all four, the effective rank by the method ``effective_rank=`` names, see
``probe.metrics``); the result holds those variables only and states their
method and accuracy in its attributes.  ``run`` returns an xarray.Dataset; see
``probe.results`` for saving it.

On CUDA the layer loop never waits for the device: it only keeps a copy of
each layer; once a batch's forwards are queued, a worker thread measures its
layers on a side stream (overlapping the next batch's forwards) and copies the
numbers to pinned host memory.  On a CPU each layer is measured at once.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from probe import bounds, checks, memory, metrics, theory
from probe.ablate import PRESETS, parse_variants
from probe.errors import ProbeError
from probe.inputs import Inputs, check_input_kind, image_files, model_inputs, read_text
from probe.load import ProbedModel, check_seed, load
from probe.metrics import effective_rank_method
from probe.names import EFFECTIVE_RANK_METHODS, INITS, METRICS, SURGERIES
from probe.results import ENGINE, settings_id, utc_now, versions
from probe.trace import check_norm_variant, layer_values

Progress = Callable[[int, int, str], None]

#: The metrics a run computes unless told otherwise: all of them (the effective rank by the
#: method that fits the size, see probe.metrics).
DEFAULT_METRICS: tuple[str, ...] = METRICS


def parse_metrics(metrics: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"all"``/None, a comma list or a sequence of names -> names in the order of METRICS.

    CLI spellings (``stable-rank``) and library ones (``stable_rank``) are both accepted.  The
    relative residual is always computed: it is the paper's measure, the report is built on it,
    and it needs no spectrum."""
    if metrics is None:
        return DEFAULT_METRICS
    given = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    names = [str(name).strip().replace("-", "_") for name in given if str(name).strip()]
    if names == ["all"]:
        return METRICS
    unknown = [name.replace("_", "-") for name in names if name not in METRICS]
    if unknown or not names:
        choices = ", ".join(name.replace("_", "-") for name in METRICS)
        what = f"unknown metric {', '.join(unknown)}" if unknown else "no metric given"
        raise ProbeError(f"{what}; --metrics takes all or a comma list of {choices}")
    return tuple(name for name in METRICS if name in names or name == "relative_residual")


def metrics_note(names: Sequence[str], method: str) -> str:
    """One sentence per computed metric: how it is computed and how accurate it is."""
    notes = {
        "relative_residual": "relative residual (both fits, every norm): exact, relative error "
        "<= 1e-10 against the float64 SVD (absolute <= 1e-14 below 1e-6)",
        "stable_rank": "stable rank: exact, relative error <= 1e-8",
        "cosine_similarity": "cosine similarity: exact, absolute error <= 1e-13",
        "effective_rank": (
            "effective rank: exact from the full spectrum, relative error <= 1e-8"
            if method == "exact"
            else "effective rank: estimated by stochastic Lanczos quadrature "
            f"({metrics.PROBES} probes x {metrics.QUADRATURE_STEPS} steps, top of the "
            "spectrum deflated), relative error within 2% per sequence, typically 0.1-0.5%"
        ),
    }
    return "; ".join(notes[name] for name in METRICS if name in names)


def parse_inits(init: str | Sequence[str]) -> list[str]:
    """``"both"``, one init, or a list -> inits in the order of probe.names.INITS."""
    wanted = list(INITS) if init == "both" else [init] if isinstance(init, str) else list(init)
    unknown = [name for name in wanted if name not in INITS]
    if unknown or not wanted:
        raise ProbeError(
            f"unknown init {', '.join(unknown) or init!r}; choose pretrained, random or both"
        )
    return [name for name in INITS if name in wanted]


@dataclass
class Plan:
    """Everything a collapse run needs, checked and loaded, before any forward pass."""

    models: list[ProbedModel]
    variants: list[str]
    inputs: Inputs
    surgery: str
    batch_size: int
    command: str
    settings: dict = field(default_factory=dict)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    effective_rank: str = "exact"  # as resolved from what was asked: exact or estimate

    @property
    def steps(self) -> int:
        """Forward passes the run makes (variants x inits x batches), for progress bars."""
        return self.steps_of((0, 1))

    def steps_of(self, part: tuple[int, int]) -> int:
        """Forward passes of one part ``(rank, world_size)`` of a data-parallel run."""
        from probe.distributed import shard

        start, stop = shard(-(-self.inputs.sequences // self.batch_size), *part)
        return len(self.variants) * len(self.models) * (stop - start)


def prepare(
    model: str | Path | ProbedModel | torch.nn.Module,
    *,
    variants: str | Sequence[str] = "all",
    init: str | Sequence[str] = "both",
    text: str | Path | None = None,
    images: str | Path | None = None,
    sequences: int | str = 32,
    tokens: int = 128,
    seed: int = 0,
    device: str | None = None,
    dtype: str | None = None,
    batch_size: int = 16,
    surgery: str = "probe",
    allow_missing_weights: bool = False,
    metrics: str | Sequence[str] | None = None,
    effective_rank: str = "auto",
    warn: Callable[[str], None] | None = None,
    command: str | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | Path | None = None,
    remote: bool | str = False,
) -> Plan:
    """Check every setting, load the models and make the inputs; no forward pass yet.

    Everything that can be wrong with a request (an unknown model, weights that do
    not fit, a bad text, too many tokens) raises :class:`ProbeError` here, so a
    command probing several models fails before it computes anything.
    """
    names = (
        parse_variants(variants)
        if isinstance(variants, str)
        else parse_variants(",".join(variants) if variants else "")
    )
    checks.integer("--batch-size", batch_size, 1)
    checks.integer("--tokens", tokens, 2)
    if sequences != "all":
        checks.integer("--sequences", sequences, 1)
    if surgery not in SURGERIES:
        raise ProbeError(f"unknown surgery {surgery!r}; choose {' or '.join(SURGERIES)}")
    chosen = parse_metrics(metrics)
    if effective_rank not in EFFECTIVE_RANK_METHODS:
        raise ProbeError(
            f"unknown effective-rank method {effective_rank!r}; "
            f"choose {', '.join(EFFECTIVE_RANK_METHODS)}"
        )
    check_seed(seed)
    if text is not None:
        read_text(text)  # a bad --text fails before any model is loaded
    if images is not None:
        image_files(images)  # and so does a bad --images
    spread = {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload_folder}
    if remote:  # NDIF (True) or nnsight's local simulation of it ("local"); see probe.load
        spread["remote"] = remote
    models = _load_all(model, parse_inits(init), seed, device, dtype, allow_missing_weights, spread)
    first = models[0]
    for name in names:  # a family without the LayerNorm variants says so before any work
        check_norm_variant(first, PRESETS[name])
    check_input_kind(first, text, images)
    limit = first.adapter.max_tokens(first.config)
    if first.adapter.inputs == "ids" and limit is not None and tokens > limit:
        raise ProbeError(
            f"{first.name} takes at most {limit} tokens per sequence; use --tokens {limit} or fewer"
        )
    # "all": every image of --images, or as many sequences as the text holds (one per
    # `tokens` characters at most).
    if sequences != "all":
        most = sequences
    elif images is not None:
        most = len(image_files(images))
    else:
        most = len(read_text(text)[0]) // tokens + 1
    memory.require_run(first, most, tokens, batch_size)
    inputs = model_inputs(
        first,
        text=text,
        images=images,
        sequences=sequences,
        tokens=tokens,
        seed=seed,
        warn=warn,
    )
    settings = {
        "model": first.name,
        "init": [m.init for m in models],
        "variants": names,
        "surgery": surgery,
        "seed": first.seed,
        "sequences": inputs.sequences,
        "tokens": inputs.tokens,
        "text": inputs.text_sha256 or inputs.text_source,
        "dtype": str(first.dtype).removeprefix("torch."),
        "device": first.device.type,
        "batch_size": batch_size,
        "allow_missing_weights": allow_missing_weights,
        "metrics": list(chosen),
    }
    if "effective_rank" in chosen:  # what "auto" means at this size and device
        settings["effective_rank"] = effective_rank_method(
            effective_rank, inputs.tokens, first.adapter.hidden_size(first.config), first.device
        )
    if command is None:
        command = _equivalent_command(model, settings, text, images, effective_rank)
    # The method as resolved here, not "auto": what the result's attrs state is what runs.
    method = settings.get("effective_rank", "exact")
    return Plan(models, names, inputs, surgery, batch_size, command, settings, chosen, method)


def execute(
    plan: Plan,
    progress: Progress | None = None,
    stream_to: str | Path | None = None,
    part: tuple[int, int] = (0, 1),
) -> xr.Dataset:
    """Run a prepared plan: every variant and init, batch by batch; the Dataset.

    ``stream_to``: a netCDF path; each batch's results are appended to it as they come
    (:mod:`probe.stream`), so memory does not grow with the number of sequences, and the
    returned Dataset reads from that file lazily.

    ``part=(rank, world_size)``: run only this rank's share of the batches
    (:func:`probe.distributed.shard`, a contiguous run of whole batches), with the global
    sequence numbers; the shards of all ranks, concatenated along ``sequence`` in rank
    order, are the single-process result bit for bit (every batch is the same forward pass).
    ``attrs["world_size"]`` records the number of parts.
    """
    from probe.distributed import shard

    rank, world_size = part
    batches = plan.inputs.batches(plan.batch_size)
    mine = batches[slice(*shard(len(batches), rank, world_size))]
    first = mine[0][0] if mine else min(plan.inputs.sequences, len(batches) * plan.batch_size)
    count = sum(ids.shape[0] for _, ids, _ in mine)
    blocks = _blocks(plan, mine, progress, part)
    measured = None  # the theory panel's residuals, from the run's first batch
    if stream_to is not None:
        from probe.stream import SequenceWriter

        skeleton = _dataset(_empty(plan, 0), plan, world_size, theory_panel=False)
        with SequenceWriter(stream_to, skeleton, first=first) as writer:
            for start, block, panel in blocks:
                writer.append(block)
                measured = panel if start == 0 else measured
            writer.fill(_theory(plan, measured))
        return xr.open_dataset(stream_to, engine=ENGINE)
    data = _empty(plan, count)
    for start, block, panel in blocks:
        measured = panel if start == 0 else measured
        for name, values in block.items():
            data[name][:, :, :, start - first : start - first + values.shape[3]] = values
    ds = _dataset(data, plan, world_size, measured)
    return ds.assign_coords(sequence=first + np.arange(count))


def _theory(plan: Plan, measured: list[dict[str, np.ndarray]] | None) -> xr.Dataset:
    """The theory panel (result variables), from the residuals the run's first batch measured
    (``measured``) where it holds them, else from traces of its own (a shard of a torchrun
    run without the first batch, or a run without SAN, SAN+MLP or SAN+skip)."""
    return theory.panels(plan.models, plan.inputs, plan.batch_size, measured=measured)


def _blocks(plan: Plan, batches, progress: Progress | None, part: tuple[int, int] = (0, 1)):
    """(first sequence, results) of ``batches``: every variant and init of a batch at once.

    On a CPU each layer is measured as it comes out of the trace.  On CUDA the layer loop
    only keeps each layer's hidden states; once a batch's forwards are queued its layers are
    measured on a side stream by a worker thread, while the next batch's forwards run, and
    the batch's results are read (the only wait) just before the one after it starts."""
    cuda = plan.models[0].device.type == "cuda"
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
    cuda = plan.models[0].device.type == "cuda"
    # X_0 is shared by a model's variants: one reducer per model keeps its metrics.
    reducers = [_Reducer(L + 1, plan, cuda) for _ in plan.models]
    runs = []
    for i, variant in enumerate(plan.variants):
        ablation = PRESETS[variant].with_surgery(plan.surgery)
        tap = panel if variant in theory.PANEL_VARIANTS and plan.surgery == "probe" else 0
        for j, probed in enumerate(plan.models):
            reducers[j].panel = tap
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
    block = _empty(plan, sequences)
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

    The values are copied into pinned host memory without blocking; the one wait is at the
    end, for the whole batch, off the thread that queues the forwards."""
    device = plan.models[0].device
    side = torch.cuda.Stream(device)
    measured = []
    with torch.cuda.stream(side):
        side.wait_event(ready)
        for i, j, per_layer, tap in runs:
            layers = []
            for layer, (x, real) in enumerate(per_layer):
                _check_finite(x, real, layer)  # waits for the device: off the forward's thread
                values = metrics.collapse_metrics(x, real, plan.metrics, plan.effective_rank)
                if tap:
                    values[PANEL] = theory.residual_norms(x[:tap], real[:tap])
                layers.append({name: _to_host(value) for name, value in values.items()})
            measured.append((i, j, layers, tap))
    side.synchronize()
    return _block(plan, sequences, measured)


def _to_host(value: torch.Tensor) -> torch.Tensor:
    """A non-blocking copy into pinned host memory (readable once the stream is synced)."""
    host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
    return host.copy_(value, non_blocking=True)


def _check_finite(x: torch.Tensor, mask: torch.Tensor, layer: int) -> None:
    # One pass over the whole layer first (no copy); only a layer holding a non-finite value
    # somewhere has its real tokens picked out (padding may hold anything).
    if bool(torch.isfinite(x).all()):
        return
    if not bool(torch.isfinite(x[mask.bool()]).all()):
        # The weights are finite (checked at load): the forward pass overflowed.
        raise ProbeError(
            f"layer {layer}'s token representations hold NaN or inf: the forward pass "
            f"overflowed in {str(x.dtype).removeprefix('torch.')}; use --dtype float32 or float64"
        )


class _Reducer:
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
            _check_finite(x, mask, layer)
            values = metrics.collapse_metrics(x, mask, self.metrics, self.method)
            values = {name: value.cpu() for name, value in values.items()}
            if layer == 0:
                self.first = (x.clone(), mask.clone(), values)
        if self.panel:
            n = self.panel
            values = {**values, PANEL: theory.residual_norms(x[:n], mask[:n]).cpu()}
        return values


def run(
    model: str | Path | ProbedModel | torch.nn.Module,
    *,
    progress: Progress | None = None,
    **options,
) -> xr.Dataset:
    """Probe ``model`` and return the collapse Dataset (see the module docstring).

    ``model`` is a hub id, a local folder, ``minilm``, or an already loaded
    :class:`~probe.load.ProbedModel` (then only its own init is run).  The
    options are those of :func:`prepare`, and ``stream_to`` of :func:`execute`.
    """
    stream_to = options.pop("stream_to", None)
    return execute(prepare(model, **options), progress, stream_to)


def _equivalent_command(
    model, settings: dict, text, images=None, effective_rank: str = "auto"
) -> str:
    """The CLI command with the same settings, for the "reproduce with" line of a library run."""
    if isinstance(model, ProbedModel | torch.nn.Module):
        return (
            "probe.analyses.collapse.run(<a model passed by the caller>, "
            + ", ".join(f"{k}={v!r}" for k, v in settings.items() if k != "model")
            + ")"
        )
    init = settings["init"]
    args = [
        "probe",
        "collapse",
        str(model),
        "--init",
        "both" if len(init) == 2 else init[0],
        "--variants",
        ",".join(settings["variants"]),
        "--sequences",
        str(settings["sequences"]),
        "--tokens",
        str(settings["tokens"]),
        "--seed",
        str(settings["seed"]),
        "--dtype",
        settings["dtype"],
        "--batch-size",
        str(settings["batch_size"]),
    ]
    if text is not None:
        args += ["--text", str(text)]
    if images is not None:
        args += ["--images", str(images)]
    if settings["surgery"] != "probe":
        args += ["--surgery", settings["surgery"]]
    if settings["device"] != "cpu":
        args += ["--device", settings["device"]]
    if settings["allow_missing_weights"]:
        args.append("--allow-missing-weights")
    if tuple(settings["metrics"]) != METRICS:
        args += ["--metrics", ",".join(m.replace("_", "-") for m in settings["metrics"])]
    if effective_rank != "auto" and "effective_rank" in settings:
        args += ["--effective-rank", effective_rank]
    return shlex.join(args)


def _empty(plan: Plan, sequences: int) -> dict[str, np.ndarray]:
    shape = (len(plan.variants), len(plan.models), plan.models[0].n_layers + 1, sequences)
    sizes = {"relative_residual": (len(metrics.FITS), len(metrics.NORMS))}
    return {name: np.full(shape + sizes.get(name, ()), np.nan) for name in plan.metrics}


def _load_all(model, inits, seed, device, dtype, allow_missing, spread=None) -> list[ProbedModel]:
    if isinstance(model, ProbedModel):
        if inits != [model.init]:
            raise ProbeError(
                f"this model is loaded with init {model.init!r}; pass init={model.init!r}"
            )
        return [model]
    # Pretrained first: if its weights cannot be had, nothing runs.
    return [
        load(
            model,
            init=name,
            seed=seed,
            device=device,
            dtype=dtype,
            allow_missing_weights=allow_missing,
            **(spread or {}),
        )
        for name in inits
    ]


def _dataset(
    data, plan: Plan, world_size: int = 1, measured=None, theory_panel: bool = True
) -> xr.Dataset:
    """The result Dataset; ``theory_panel=False`` leaves the panel's variables NaN (a
    streamed result fills them in once its first batch has run)."""
    models, variants, inputs = plan.models, plan.variants, plan.inputs
    first = models[0]
    dims = ("variant", "init", "layer", "sequence")
    coords = {
        "variant": list(variants),
        "init": [m.init for m in models],
        "layer": np.arange(first.n_layers + 1),
        "sequence": np.arange(data[plan.metrics[0]].shape[3]),
        "fit": list(metrics.FITS),
        "norm": list(metrics.NORMS),
    }
    long_names = {
        "relative_residual": "relative residual ||res(X)|| / ||X||",
        "effective_rank": "effective rank (Roy & Vetterli 2007)",
        "stable_rank": "stable rank sum s_i^2 / s_1^2",
        "cosine_similarity": "mean pairwise cosine similarity of tokens",
    }
    extra = {"relative_residual": ("fit", "norm")}
    ds = xr.Dataset(
        {name: (dims + extra.get(name, ()), data[name]) for name in plan.metrics},
        coords=coords,
    )
    for name in plan.metrics:
        ds[name].attrs["long_name"] = long_names[name]
    ds["layer"].attrs["long_name"] = "layer (0 = embeddings' output)"
    adapter, config = first.adapter, first.config
    ds.attrs = {
        "analysis": "collapse",
        "model": first.name,
        "family": first.family,
        "config": config.to_json_string(use_diff=True),
        "weights": "; ".join(f"{m.init}: {m.weights}" for m in models),
        "weights_warning": "; ".join(
            f"{m.init} weights come from an incomplete checkpoint (--allow-missing-weights): "
            "some tensors are at random init, see 'weights'"
            for m in models
            if m.incomplete
        ),
        "inputs": inputs.kind,
        "text_source": inputs.text_source,
        "text_sha256": inputs.text_sha256,
        "sequences": inputs.sequences,
        "tokens": inputs.tokens,
        "seed": first.seed,
        "dtype": str(first.dtype).removeprefix("torch."),
        "device": str(first.device),
        # accelerate's placement where --device-map spread the model ({} when it did not).
        "device_map": json.dumps({k: str(v) for k, v in (first.device_map or {}).items()}),
        **versions(),
        "command": plan.command,
        "created": utc_now(),
        "surgery": plan.surgery,
        "metrics": ",".join(plan.metrics),
        "metrics_note": metrics_note(plan.metrics, plan.settings.get("effective_rank", "exact")),
        "surgery_note": _surgery_note(plan.surgery, adapter),
        "ablation_table": json.dumps(list(adapter.table)),
        "n_layers": first.n_layers,
        "n_heads": adapter.n_heads(config),
        "hidden_size": adapter.hidden_size(config),
        "residual_stream": adapter.stream_note,
        "attention": first.attn_implementation,
        # 1 where a token attends only to earlier ones (decoders): their SAN collapses slower.
        "causal": int(
            adapter.spec.causal if hasattr(adapter, "spec") else first.family == "fastformer"
        ),
        "spec": adapter.describe(config) if hasattr(adapter, "describe") else "",
        "settings": json.dumps(plan.settings, sort_keys=True),
        "settings_id": settings_id(plan.settings),
        # Processes the run was split over (torchrun); the numbers do not depend on it.
        "world_size": int(world_size),
    }
    # The paper's bounds from the model's own weights beside measured residuals
    # (probe.theory: Theorem 2.2, Corollaries 3.1 and 3.2), for the report's panel.
    if theory_panel:
        panel = _theory(plan, measured)
    else:
        panel = bounds.empty(coords["init"], coords["layer"])
    ds = ds.assign(panel.data_vars)
    ds.attrs.update(panel.attrs)
    return ds


def _surgery_note(surgery: str, adapter) -> str:
    if surgery == "probe":
        return "probe's definitions: no skip drops the identity term of the attention residual sum; no MLP makes the layer output its attention sublayer's output"
    return f"the paper's surgery as its code applied it: {adapter.paper_surgery}"
