"""What trained transformers do instead of collapsing: sinks, massive activations, spectra.

Beside the collapse of the same model on the same inputs, this analysis measures what
research since Dong et al. (2021) found trained transformers doing with the pull toward
rank one (``probe.measures.attention_stats`` defines every quantity and cites its source):

* attention sinks: ``sink_score`` (init, layer, head), the attention the first token
  receives, ``sink_frequency`` (init, layer, head), the share of sequences in which it
  exceeds eps, and Gu et al.'s ``sink_rate`` Sink_eps (init), their mean; ``sink_head_share``
  (init), the share of heads whose mean score exceeds eps; ``top_key`` / ``top_key_score``,
  the key position that receives the most attention (Clark et al.'s [CLS]/[SEP]);
* ``attention_entropy`` (nats), ``attention_gap`` sigma_1 - sigma_2 and
  ``attention_stable_rank`` of every head's T x T attention matrix;
* massive activations (Sun et al. 2024): ``massive_ratio`` (init, layer), the largest
  |entry| of a layer's output over the median, and where it is (``massive_sequence``,
  ``massive_token``, ``massive_dim``);
* ``anisotropy`` (init, layer): Ethayarajh's mean cosine between tokens of different
  sequences (probe collapse's ``cosine_similarity`` is the within-sequence one);
* ``input_ids`` (sequence, token) and ``token_text``: what ran (padding: -1 and "";
  pixel inputs: the patch index), so that every sink can be named by its token.

The model runs unablated, with the eager attention probe already registers (HF's SDPA never
forms the probabilities); the probabilities are read by the family's walker
(``paths_stream``) and reduced next to the model, layer by layer: only per-(layer, head)
sums and vectors of the hidden size leave a layer, never an attention matrix.  Layer 0 is
the embeddings' output (no attention): its attention statistics are NaN.  The Fastformer's
additive poolings are not T x T attention: for it only the hidden-state statistics are
measured (``attention_note`` says so).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from probe.errors import ProbeError
from probe.files.results import utc_now, versions
from probe.loading import ProbedModel
from probe.measures.attention_stats import (
    EPSILON,
    Totals,
    check_epsilon,
    head_sums,
    sink_head_share,
    sink_rate,
)
from probe.measures.overflow import DEGENERATE, check_finite, check_nonzero
from probe.models.attention import learned_sinks
from probe.requests.inputs import Encoded, image_tokens
from probe.requests.request import Inputs, Model, dtype_name, provenance, record
from probe.surgery import masks
from probe.surgery.ablate import TRANSFORMER, Ablation
from probe.surgery.masks import Mask
from probe.surgery.scaling import ONE, BranchScale, parse_branch_scale
from probe.surgery.trace import check_norm_variant

from .preamble import begin

Progress = Callable[[int, int, str], None]
"""A progress callback: called with (forward passes done, forward passes in all, a label)."""

#: The attention statistics, (init, layer, head) each.
HEAD_VARIABLES = (
    "sink_score",
    "sink_frequency",
    "top_key",
    "top_key_score",
    "attention_entropy",
    "attention_gap",
    "attention_stable_rank",
)
#: The hidden-state statistics, (init, layer) each.
LAYER_VARIABLES = (
    "massive_ratio",
    "massive_sequence",
    "massive_token",
    "massive_dim",
    "anisotropy",
)
LONG_NAMES = {
    "sink_score": "attention the first token receives, mean over query rows and sequences",
    "sink_frequency": "share of sequences whose first-token score exceeds eps",
    "sink_rate": "Sink_eps (Gu et al. 2025): share of (sequence, layer, head) whose "
    "first-token score exceeds eps",
    "sink_head_share": "share of (layer, head) pairs whose mean sink_score exceeds eps",
    "top_key": "key position receiving the most attention (mean over the rows that see it "
    "and sequences)",
    "top_key_score": "mean attention the top key receives",
    "attention_entropy": "mean row entropy -sum_k A_ik log A_ik of the attention, nats",
    "attention_gap": "sigma_1 - sigma_2 of the T x T attention matrix, mean over sequences",
    "attention_stable_rank": "sum sigma_i^2 / sigma_1^2 of the attention matrix, mean over sequences",
    "massive_ratio": "mean top |entry| over mean median |entry| of the layer output (Sun et al. 2024)",
    "massive_sequence": "sequence of the largest |entry| of the layer output",
    "massive_token": "token position of the largest |entry| of the layer output",
    "massive_dim": "hidden dimension of the largest |entry| of the layer output",
    "anisotropy": "mean cosine between tokens of different sequences (Ethayarajh 2019)",
    "learned_sink_share": "share of each row the learned sink logit takes (1 - sum_k A_ik), "
    "mean over query rows and sequences",
    "input_ids": "token ids that ran (-1: padding; pixel inputs: the patch index)",
    "token_text": "the tokenizer's string of each token ('' for padding or without a tokenizer)",
}


#: What the statistics mean where the softmax has learned sink logits (GPT-OSS), in the
#: result's ``learned_sink_note``.
LEARNED_SINKS = (
    "the attention has learned sink logits: each row's probabilities over the keys sum to "
    "1 - learned_sink_share; sink_score, top_key, the received attention and the spectrum "
    "read them as the model uses them (not renormalised), and attention_entropy counts the "
    "learned sink as one more outcome of each row"
)
#: Why a run of one sequence has no anisotropy, in its variable's ``note``.
ONE_SEQUENCE = "NaN: one sequence has no pair of tokens from different sequences; run two or more"


def has_attention(probed: ProbedModel) -> bool:
    """Whether the family has T x T attention probabilities (the Fastformer's are poolings)."""
    return probed.family != "fastformer"


def run(
    model: Model | str | Path | ProbedModel | torch.nn.Module,
    inputs: Inputs | None = None,
    *,
    epsilon: float = EPSILON,
    branch_scale: str | float | BranchScale = 1,
    mask: str | Mask = "model",
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
    command: str | None = None,
    **flat,
) -> xr.Dataset:
    """Attention sinks, entropy, spectra, massive activations and anisotropy (module docstring).

    Parameters
    ----------
    model
        A [`probe.Model`][probe.requests.request.Model], or what one holds: a hub id, a local
        folder, `minilm`, an `nn.Module` or a loaded
        [`ProbedModel`][probe.loading.ProbedModel] (then only its own init is run).
    inputs
        A [`probe.Inputs`][probe.requests.request.Inputs]; unset sizes default to 32 sequences of
        128 tokens in batches of 8.
    epsilon
        The sink threshold of `sink_rate`, strictly between 0 and 1 (Gu et al.: 0.3).
    branch_scale
        The model's residual branches scaled, y = x + alpha f(x), as in
        [`collapse.prepare`][probe.analyses.collapse.prepare] (`probe.surgery.scaling`); 1 runs
        the model as it is.
    mask
        The attention mask every layer runs with, as in
        [`collapse.prepare`][probe.analyses.collapse.prepare] (`probe.surgery.masks`).
    progress
        Called after each forward pass with (passes done, passes in all, a label naming
        the init); None: silent.
    warn
        Called with one line when the text or image folder holds fewer sequences than
        asked (the run uses those); None: no warnings.
    command
        The command line the result records as what made it; None: a library call, whose
        request the result records as data, attribute `request` (`probe.reports.reproduce`
        renders its `probe attention` command).
    **flat
        The request's keywords beside a model name (`init=`, `tokens=`, ...), the same
        request as `Model(name, ...)` and `Inputs(...)`; not together with them.

    Returns
    -------
    xarray.Dataset
        The attention statistics over (init, layer, head), the hidden-state statistics
        over (init, layer), `sink_rate` and `sink_head_share` over (init,), `input_ids`
        and `token_text`; attributes that say how it was made.

    Raises
    ------
    ProbeError
        A request that cannot run: an `epsilon` outside (0, 1), `sequences="all"`, more
        tokens than the model takes, a branch scale its family does not run, weights that
        cannot be had, too little memory; a forward pass that overflows, at its first layer
        holding NaN or inf (`probe.measures.overflow`); degenerate weights: a layer all zero in a
        sequence, or zero in half its entries or more in every sequence.
    """
    epsilon = check_epsilon(epsilon)
    scale = parse_branch_scale(branch_scale)
    asked = masks.parse_mask(mask)

    def check(models: list[ProbedModel], given: Inputs) -> int:
        masks.check(models[0], asked)
        # A family outside the walker refuses a branch scale.
        check_norm_variant(models[0], _clean(scale, models[0]))
        return _extra_bytes(models[0], given)

    sizes = {"sequences": 32, "tokens": 128, "batch_size": 8}
    begun = begin(model, inputs, flat, sizes=sizes, check=check, warn=warn)
    request, given, models, encoded = begun.request, begun.given, begun.models, begun.inputs
    first = begun.first
    clean = _clean(scale, first)
    alpha = clean.branch_scale
    totals = []
    batches = encoded.batches(given.batch_size)
    done = 0
    with masks.applied(models, asked):
        for probed in models:
            sums = Totals(probed.n_layers)
            for start, ids, padding in batches:
                run_mask = masks.effective(probed, asked)
                measure_batch(
                    probed, ids, padding, sums, start, ablation=clean, epsilon=epsilon,
                    run_mask=run_mask,
                )  # fmt: skip
                done += 1
                if progress is not None:
                    progress(done, len(models) * len(batches), f"{probed.init} attention")
            _check_medians(probed, sums)
            totals.append(sums)
    recorded = ""
    if isinstance(request.source, str | Path):
        options = (epsilon, scale, asked)
        recorded = _record(request, given, encoded, options, dtype_name(first.dtype))
    if command is None:
        command = "" if recorded else "probe.attention(<a model>)"
    made = (command, recorded)
    return _dataset(models, encoded, totals, epsilon, made, (scale, alpha), asked)


def _clean(scale: BranchScale, first: ProbedModel) -> Ablation:
    """The unablated run, at the model's branch scale."""
    return TRANSFORMER if scale.is_one else Ablation(branch_scale=scale.value(first.n_layers))


def _extra_bytes(first: ProbedModel, given: Inputs) -> int:
    """What a run holds beyond its inputs and forwards: per layer, the probabilities in
    float64, masked, and one sequence's singular values."""
    if not has_attention(first):
        return 0
    tokens = image_tokens(first.config) if first.adapter.inputs == "pixels" else given.tokens
    heads = first.adapter.n_heads(first.config)
    batch = min(given.batch_size, given.sequences)
    return 3 * batch * heads * tokens * tokens * 8


#: The library's name for the analysis: ``probe.attention(model, inputs, epsilon=0.3)``.
attention = run


def _record(request: Model, given: Inputs, encoded: Encoded, options, dtype) -> str:
    """The request as the result keeps it (``probe.requests.request.record``): the options
    (epsilon, branch scale, mask) not at their defaults."""
    epsilon, scale, mask = options
    own = {} if epsilon == EPSILON else {"epsilon": epsilon}
    own |= {} if scale.is_one else {"branch_scale": scale.text}
    own |= {} if mask.is_model else {"mask": mask.text}
    sizes = {"sequences": encoded.sequences, "tokens": encoded.tokens}
    return record("attention", request, given, own, dtype=dtype, **sizes)


def measure_batch(
    probed: ProbedModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    sums: Totals,
    start: int,
    spectrum: bool = True,
    ablation: Ablation = TRANSFORMER,
    epsilon: float = EPSILON,
    run_mask: Mask = Mask(),  # noqa: B008 (a frozen value)
) -> None:
    """One unablated forward of one batch (``ablation``: the transformer, or with its branches
    scaled); each layer reduced inside the trace into ``sums`` (``spectrum=False`` leaves
    out the singular values: the benchmark times them apart).  ``run_mask``: the mask the
    run applies (``masks.effective``); the statistics read which keys each query saw from
    it, or, for the model's own, from what each layer's attention received."""
    device = probed.device
    ids, mask = ids.to(device), mask.to(device)
    real = mask.bool()
    adapter, root = probed.adapter, probed.envoy
    wanted = has_attention(probed)
    outside = learned_sinks(probed.model)  # rows that sum to less than one (GPT-OSS)
    keep = real[:, None, :, None] & real[:, None, None, :]  # the real (query, key) pairs
    where, scaled = f"{probed.name} ({probed.init})", ablation.branch_scale != 1
    with (
        torch.no_grad(),
        probed.tracer_root.trace(**adapter.model_inputs(ids, mask), **probed.trace_options) as tr,
    ):
        if wanted:
            reads = adapter.paths_stream(root, tr, ablation, norms=False, masks=True)
        else:
            reads = ({"x": x} for x in adapter.stream(root, tr, ablation))
        for layer, values in enumerate(reads):
            # An overflow stops the run here, before any statistic sees it (probe.measures.overflow).
            if "attn" in values:
                probs = values["attn"]
                check_finite(probs, keep, layer, where, "attention probabilities", scaled)
                given = values.get("mask", masks.UNREAD)
                seen = masks.seen(run_mask, real, given, adapter.causal)
                sums.add_heads(layer, head_sums(probs, real, seen, spectrum, epsilon, outside))
            check_finite(values["x"], real, layer, where, scaled=scaled)
            check_nonzero(values["x"], real, layer, where, why=ZERO_LAYER)
            sums.add_hidden(layer, values["x"], real, start)
    if len(sums.massive) != probed.n_layers + 1:
        raise RuntimeError(f"traced {len(sums.massive)} layers, expected {probed.n_layers + 1}")


#: What a layer whose tokens are all zero in a sequence does to this analysis.
ZERO_LAYER = "nothing is there to measure and the next layer's attention sees no token"


def _check_medians(probed: ProbedModel, sums: Totals) -> None:
    """Refuse, in one line, a layer whose median |entry| is 0 in every sequence: its
    massive_ratio would divide by 0 (every entry zero is refused at the layer already)."""
    for layer in sorted(sums.massive):
        if float(sums.massive[layer]["median"]) == 0:
            raise ProbeError(
                f"{probed.name} ({probed.init}): layer {layer}'s token representations are "
                "zero in half their entries or more in every sequence, so massive_ratio "
                f"divides by a median of 0: {DEGENERATE}"
            )


def token_text(probed: ProbedModel, encoded: Encoded) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, token_text), each (sequence, token): -1 and "" at padding; pixel inputs
    get their patch index and no text."""
    mask = encoded.attention_mask.bool().numpy()
    if encoded.input_ids.dim() != 2:  # pixels: token t is patch t (0 = [CLS])
        ids = np.broadcast_to(np.arange(mask.shape[1]), mask.shape).copy()
        return ids, np.full(mask.shape, "", dtype=object)
    ids = np.where(mask, encoded.input_ids.numpy(), -1)
    text = np.full(mask.shape, "", dtype=object)
    tokenizer = probed.tokenizer
    if tokenizer is not None:
        for s in range(mask.shape[0]):
            real = ids[s][mask[s]].tolist()
            text[s, mask[s]] = tokenizer.convert_ids_to_tokens(real)
    return ids, text


def _dataset(
    models: list[ProbedModel],
    encoded: Encoded,
    totals: list[Totals],
    epsilon: float,
    made: tuple[str, str],
    scaled: tuple[BranchScale, float] = (ONE, 1.0),
    mask: Mask = Mask(),  # noqa: B008 (a frozen value)
) -> xr.Dataset:
    first = models[0]
    L, H = first.n_layers, first.adapter.n_heads(first.config)
    shape = (len(models), L + 1, H)
    learned = learned_sinks(first.model)
    names = HEAD_VARIABLES + (("learned_sink_share",) if learned else ())
    data = {name: np.full(shape, np.nan) for name in names}
    data["top_key"] = np.full(shape, -1, dtype=np.int64)
    layer_data = {name: np.full(shape[:2], np.nan) for name in LAYER_VARIABLES}
    rate, share = np.full(len(models), np.nan), np.full(len(models), np.nan)
    for i, sums in enumerate(totals):
        for name, value in sums.attention().items():
            data[name][i, 1:] = value.numpy()
        for name, value in sums.hidden().items():
            layer_data[name][i] = value.numpy()
        if sums.heads:
            rate[i] = float(sink_rate(torch.from_numpy(data["sink_frequency"][i, 1:])))
            share[i] = float(sink_head_share(torch.from_numpy(data["sink_score"][i, 1:]), epsilon))
    head_dims, layer_dims = ("init", "layer", "head"), ("init", "layer")
    ids, text = token_text(first, encoded)
    ds = xr.Dataset(
        {
            **{name: (head_dims, value) for name, value in data.items()},
            **{name: (layer_dims, value) for name, value in layer_data.items()},
            "sink_rate": (("init",), rate),
            "sink_head_share": (("init",), share),
            "input_ids": (("sequence", "token"), ids),
            "token_text": (("sequence", "token"), text.astype(str)),
        },
        coords={
            "init": [m.init for m in models],
            "layer": np.arange(L + 1),
            "head": np.arange(H),
            "sequence": np.arange(encoded.sequences),
            "token": np.arange(encoded.tokens),
        },
    )
    for name in ("massive_sequence", "massive_token", "massive_dim"):
        ds[name] = ds[name].astype(np.int64)
    for name, long_name in LONG_NAMES.items():
        if name in ds:
            ds[name].attrs["long_name"] = long_name
    if encoded.sequences == 1:
        ds["anisotropy"].attrs["note"] = ONE_SEQUENCE
    ds["layer"].attrs["long_name"] = "layer (0 = embeddings' output)"
    ds.attrs = {
        "analysis": "attention",
        **provenance(models, encoded),
        **versions(),
        "world_size": 1,
        "command": made[0],  # the command line; or the request as data (made[1])
        "request": made[1],
        "created": utc_now(),
        "epsilon": epsilon,
        **masks.attrs(first, mask, encoded.tokens),
        "attention_note": attention_note(first),
        **({"learned_sink_note": LEARNED_SINKS} if learned else {}),
        "settings": json.dumps(
            {"epsilon": epsilon}
            | ({} if scaled[0].is_one else {"branch_scale": scaled[0].text})
            | ({} if mask.is_model else {"mask": mask.text}),
            sort_keys=True,
        ),
    }
    # The branch scale only where one is set: an unscaled result keeps its attributes, and
    # so its file name (a hash of them).
    if not scaled[0].is_one:
        ds.attrs |= {"branch_scale": scaled[0].text, "branch_scale_value": float(scaled[1])}
    return ds


def attention_note(probed: ProbedModel) -> str:
    """What is measured for this family, one line."""
    if has_attention(probed):
        return (
            "every statistic measured; attention from the eager probabilities, layer 0 "
            "(embeddings) has none"
        )
    return (
        f"the {probed.family} family has no T x T attention probabilities (additive "
        "poolings): massive activations and anisotropy are measured, the attention "
        "statistics (sink_score, sink_rate, top_key, entropy, gap, stable rank) are not (NaN)"
    )
