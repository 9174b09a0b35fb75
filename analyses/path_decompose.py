"""Exact path-length decomposition of a real model's SAN+skip variant (Dong et al. 2021, Section 2.2).

Run the SAN+skip variant (MLPs removed, skip connections kept) on real inputs;
freeze, for this input, the attention probabilities and the per-token scale of
each norm; the frozen network is then affine in its embeddings X_0 and its
output is exactly

    X_L = sum_{k=0..L} V_L[k] + K_L,

V_L[k] the summed contribution of the C(L,k) H^k paths through k heads, K_L one
constant that gathers every bias (``probe.measures.frozen`` has the programme).  What is
frozen, per norm kind (the family's spec says which it has):

* LayerNorm (BERT, GPT-2, OPT, GPT-J, Falcon, GPT-NeoX, ModernBERT, ViT, ...):
  1/sigma per token; the centring stays linear, beta goes to the constant;
* RMSNorm (Llama, Mistral, Qwen2/3, Phi3, T5): 1/rms per token; no mean, no beta;
* Gemma's RMSNorm: the same, scaled by (1 + w);
* no norm (ModernBERT's first layer, an Identity): nothing.

Where the frozen norm sits is the family's business: after the sum of skip and
heads for post-LN families (BERT, RoBERTa, ELECTRA, DeBERTa-v2, DistilBERT,
ALBERT, XLNet, OPT-350m); on the heads' input for pre-LN ones (GPT-2, Llama, ...,
and the parallel GPT-J, GPT-NeoX and Falcon, which are pre-LN once the MLP is
removed), whose final norm is part of the output and frozen too; Gemma2 adds its
post-attention norm on the heads' output, frozen the same way.  Grouped-query
attention enters through W_v only: each query head uses the value projection of
its key/value group.

Reported per layer l = 0..L, path length k and sequence (norms: Frobenius and
the paper's l1inf):

* ``share``: ||V_l[k]|| / sum_j ||V_l[j]||, the norm share of length k, next to
  ``uniform_share`` C(l,k) H^k / (H+1)^l, the share by count;
* ``effective_length``: sum_k k share_k, the norm-weighted mean length;
* ``truncation_error``: ||X_l - (sum_{j<=k} V_l[j] + K_l)|| / ||X_l||, the
  constant always kept;
* ``constant_share``: ||K_l|| / ||X_l||; ``reconstruction_error``: how far the
  frozen network's X_l is from the real run's;

and for the model's output (X_L, or the final norm of X_L, then OPT-350m's bias-free
``project_out``, which maps every path linearly) the same share and error, plus a task measure with only paths up to length k kept: the cosine of the
mean-pooled output (the sentence embedding of encoder checkpoints such as MiniLM)
to the full one, and where the base model holds a tied LM head (GPT-2's ``wte``,
Gemma's and Falcon's embeddings, any family whose config ties them) the next-token
loss through it, with what the family's LM does to its logits (its entry's ``logits``:
Cohere's ``logit_scale``, Granite's ``logits_scaling``, Gemma2's final soft cap).

Accuracy.  The programme equals the brute-force sum over all paths to float64
rounding (~1e-15 relative).  ``reconstruction_error`` is float64 rounding too
(~1e-16) wherever the model's own norms compute in the model's dtype.  HF's
RMSNorm in Llama, Mistral, Qwen2/3, Phi3, Gemma/Gemma2 and T5 computes in float32
even in a float64 model (the input is cast to float32 for the mean of squares,
and, except in T5, for the scaling as well), so the real run carries float32
rounding that no linear map can reproduce: there the frozen network is ~1e-7 from
the real run (a few float32 units in the last place per norm applied), while the
decomposition of the frozen network itself stays exact.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from probe.errors import ProbeError
from probe.files.results import command_line, utc_now, versions
from probe.loading import ProbedModel, onloaded
from probe.measures import frozen
from probe.measures.overflow import DEGENERATE
from probe.requests.request import Inputs, Model

from . import path_checks
from .path_common import model_attrs, my_batches
from .path_frozen import (
    NORMS,
    frozen_run,
    layer_stats,
    lm_loss,
    logit_map,
    output_terms,
    pooled_cosine,
    reconstruction_tolerance,
)
from .preamble import begin

Progress = Callable[[int, int, str], None]
"""A progress callback: called with (batches done, batches in all, a label)."""


def decompose(
    model: Model | str | Path | ProbedModel | torch.nn.Module,
    inputs: Inputs | None = None,
    *,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
    command: str | None = None,
    part: tuple[int, int] = (0, 1),
    **flat,
) -> xr.Dataset:
    """The path-length decomposition of `model`'s SAN+skip variant (module docstring).

    Parameters
    ----------
    model
        A [`probe.Model`][probe.requests.request.Model], or what one holds: a hub id, a local folder,
        `minilm`, an `nn.Module` or a loaded [`ProbedModel`][probe.loading.ProbedModel] (then
        only its own init is run).
    inputs
        A [`probe.Inputs`][probe.requests.request.Inputs]; unset, the model runs in float64 on 8
        sequences of 128 tokens in batches of 4.  Not `images` (the path analyses read seeded
        noise images).
    progress
        Called after each batch with (batches done, batches in all, a label naming the init);
        None: silent.
    warn
        Called with one line when the text or image folder holds fewer sequences than asked
        (the run uses those); None: no warnings.
    command
        The "reproduce with" line the result records; None: this process's command line.
    part
        `(rank, world_size)`: decompose only this rank's share of the batches (a contiguous
        run of whole batches) and return those sequences, with their global numbers; the parts
        of all ranks, concatenated along `sequence` in rank order, are the single-process
        result bit for bit.
    **flat
        The request's keywords beside a model name (`init=`, `tokens=`, ...): the same request
        as `Model(name, ...)` and `Inputs(...)`, and not together with them.

    Returns
    -------
    xarray.Dataset
        Per init, layer, path length and sequence: `share`, `truncation_error`,
        `effective_length`, `constant_share`, `reconstruction_error`, `uniform_share` and the
        output's share, error and task measures (module docstring); attributes that say how it
        was made.

    Raises
    ------
    ProbeError
        A request that cannot run: a family whose paths are not decomposable,
        `sequences="all"`, `images`, more tokens than the model takes, too little memory;
        a forward pass that overflows; degenerate weights (a layer, or every path through
        it, all zero in a sequence).
    """
    models, inputs, has_lm, batch_size = _checked_run(model, inputs, flat, warn)
    L = models[0].n_layers
    per_layer, output = _result_arrays(len(models), L + 1, inputs.sequences, has_lm)
    chunks = my_batches(inputs, batch_size, part)
    total, done = len(models) * len(chunks), 0
    for i, probed in enumerate(models):
        with onloaded(probed.model):
            weights = [probed.adapter.layer_weights(probed.model, n) for n in range(L)]
            head = probed.adapter.lm_head(probed.model) if has_lm else None
        for start, ids, mask in chunks:
            rows = slice(start, start + ids.shape[0])
            _decompose_batch(probed, weights, head, has_lm, ids, mask, i, rows, per_layer, output)
            done += 1
            if progress is not None:
                progress(done, total, f"{probed.init} decomposition")
    ds = _dataset(per_layer, output, models, inputs, command)
    if part[1] == 1:
        return ds
    mine = slice(chunks[0][0], chunks[-1][0] + chunks[-1][1].shape[0]) if chunks else slice(0, 0)
    return ds.isel(sequence=mine)


def _checked_run(model, inputs, flat, warn) -> tuple[list[ProbedModel], Inputs, bool, int]:
    """The loaded models, their path inputs, whether they hold a tied LM head, the batch size.

    Refuses a family whose paths are not decomposable and a run too large for memory before
    the inputs are made.
    """
    sizes = {"sequences": 8, "tokens": 128, "batch_size": 4}
    begun = begin(
        model, inputs, flat, sizes=sizes, check=_memory, warn=warn, dtype="float64",
        noise_images=True,
    )  # fmt: skip
    models, first, inputs = begun.models, begun.first, begun.inputs
    batch_size = begun.given.batch_size
    with onloaded(first.model):  # weights a device_map offloaded are read in for the block
        has_lm = first.adapter.lm_head(first.model) is not None
    for probed in models:  # what probe check holds the heads and the LM head to
        path_checks.require(probed, "heads", *(("lm_head",) if has_lm else ()))
    return models, inputs, has_lm, batch_size


def _memory(models: list[ProbedModel], given: Inputs) -> int:
    """Refuse a family whose paths are not decomposable; else the bytes the run holds beyond
    its inputs and forwards: every path length's term of a layer (float64), three times over
    (terms, their running sum, the norms' work), and the result arrays."""
    first = models[0]
    if first.adapter.not_decomposable:
        raise ProbeError(f"path decomposition: {first.adapter.not_decomposable}")
    L, sequences, tokens = first.n_layers, given.sequences, given.tokens
    hidden, batch = first.adapter.hidden_size(first.config), min(given.batch_size, sequences)
    terms = 3 * (L + 1) * batch * tokens * hidden * 8
    results = len(models) * (L + 1) * (L + 1) * sequences * 2 * len(NORMS) * 8
    return terms + results


def _result_arrays(n_models: int, K: int, S: int, has_lm: bool) -> tuple[dict, dict]:
    """The per-layer and the output arrays, all NaN until their batches fill them."""
    N = len(NORMS)
    per_layer = {
        name: np.full((n_models, K, K, S, N), np.nan) for name in ("share", "truncation_error")
    }
    per_layer |= {
        name: np.full((n_models, K, S, N), np.nan)
        for name in ("effective_length", "constant_share")
    }
    per_layer["reconstruction_error"] = np.full((n_models, K, S), np.nan)
    output = {
        name: np.full((n_models, K, S, N), np.nan) for name in ("output_share", "output_error")
    }
    output["cosine"] = np.full((n_models, K, S), np.nan)
    if has_lm:
        output["loss"] = np.full((n_models, K, S), np.nan)
        output["loss_full"] = np.full((n_models, S), np.nan)
    return per_layer, output


def _decompose_batch(probed, weights, head, has_lm, ids, mask, i, rows, per_layer, output) -> None:
    """Decompose one batch of init ``i`` and fill its sequences ``rows`` of the arrays."""
    K = per_layer["share"].shape[1]
    run = frozen_run(probed, weights, ids, mask)
    # Layer by layer, only the current terms held; the last yield is the output
    # (X_L, or GPT-2's ln_f(X_L) as one extra yield).
    for layer, (terms, const) in enumerate(
        frozen.iter_path_terms(run["layers"], run["x0"], run["final"])
    ):
        if layer < K:
            stats = layer_stats(terms, const, run["xs"][layer])
            check_reconstruction(probed, layer, stats["reconstruction_error"])
            check_defined(probed, f"layer {layer}", stats)
            _fill(per_layer, i, layer, rows, stats)
    terms, const = output_terms(run, terms, const)
    out = layer_stats(terms, const, None)
    check_defined(probed, "the output", out)
    output["output_share"][i, :, rows] = out["share"]
    output["output_error"][i, :, rows] = out["truncation_error"]
    y_partial = torch.cumsum(terms, 0) + const  # (k, batch, token, hidden)
    output["cosine"][i, :, rows] = pooled_cosine(y_partial, y_partial[-1]).cpu().numpy()
    if has_lm:
        to_logits = logit_map(probed.adapter, probed.config)
        output["loss"][i, :, rows] = lm_loss(y_partial, head, ids, to_logits).cpu().numpy()
        real = run["xs"][-1] if run["output"] is None else run["output"]
        loss = lm_loss(real[None], head, ids, to_logits)[0]
        output["loss_full"][i, rows] = loss.cpu().numpy()


def check_reconstruction(probed: ProbedModel, layer: int, error: np.ndarray) -> None:
    """Refuse, in one line, a decomposition whose frozen network is not the real run."""
    worst = float(np.nanmax(error)) if np.isfinite(error).any() else 0.0
    tolerance = reconstruction_tolerance(probed.dtype, probed.n_layers)
    if worst > tolerance:
        raise ProbeError(
            f"the path decomposition of {probed.name} does not reconstruct its SAN+skip run: "
            f"relative error {worst:.3g} at layer {layer} (above {tolerance:.1e}, the rounding "
            f"of {str(probed.dtype).removeprefix('torch.')}); the {probed.family} family's "
            "entry (its Heads layout, its norms) does not fit this model"
        )


def check_defined(probed: ProbedModel, part: str, stats: dict) -> None:
    """Refuse, in one line, a decomposition whose shares or errors came out NaN or inf.

    Every entry of ``stats`` (``layer_stats``) is computed (no path length past the layer):
    one that is not finite divided by a zero norm, all of a sequence's path terms or its
    X_l zero.  An all-zero X_l is refused before (``path_frozen``); this is the rest, e.g.
    a post-LN layer whose norm scales every path by zero, leaving only its biases."""
    for name, value in stats.items():
        if not np.isfinite(value).all():
            raise ProbeError(
                f"{probed.name} ({probed.init}, SAN+skip): the {name} of {part} is 0/0 (its "
                f"paths, or what they sum to, are all zero in a sequence): {DEGENERATE}"
            )


def _fill(per_layer: dict, i: int, layer: int, part: slice, stats: dict) -> None:
    for name, value in stats.items():
        if name in ("share", "truncation_error"):  # (k <= layer, sequence, norm)
            per_layer[name][i, layer, : value.shape[0], part] = value
        else:
            per_layer[name][i, layer, part] = value


#: How each norm kind is frozen: (the norm, its per-token scale, what goes to the constant).
_NORM_WORDS = {
    "layernorm": ("LayerNorm", "1/sigma", "beta"),
    "rms": ("RMSNorm", "1/rms", ""),
    "rms+1": ("RMSNorm scaling by (1 + w) (Gemma's)", "1/rms", ""),
}


def frozen_note(probed: ProbedModel) -> str:
    """What the decomposition of this model freezes, in words (the Dataset's ``frozen`` attr)."""
    adapter, config = probed.adapter, probed.config
    with onloaded(probed.model):
        weights = [adapter.layer_weights(probed.model, n) for n in range(probed.n_layers)]
    spec = getattr(adapter, "spec", None)
    kind = spec.norm_kind if spec is not None else "layernorm"
    name, scale, shift = _NORM_WORDS[kind]
    post = weights[0].norm == "post"
    where = (
        "after the sum of skip and heads (post-LN)"
        if post
        else "on the heads' input only (pre-LN, or parallel with the MLP removed)"
    )
    # OLMo2: no norm before the attention, only the one on the heads' output.
    output_only = all(w.kind == "none" and w.branch_gamma is not None for w in weights)
    if output_only:
        where = "on the heads' output before the residual sum (none on their input)"
    parts = [
        "SAN+skip variant (MLPs removed). Frozen from its real forward pass: the attention "
        f"probabilities of every head and the per-token {scale} of each layer's {name}, "
        f"which sits {where}"
    ]
    if shift:
        parts.append(f"; its {shift} joins the constant")
    else:
        parts.append("; it has no mean and no shift")
    if kind != "layernorm":
        parts.append(
            " (transformers computes this RMSNorm in float32 even in a float64 model, so the "
            "real run carries float32 rounding: reconstruction_error is ~1e-7 here, while the "
            "decomposition of the frozen network stays exact)"
        )
    if any(w.kind == "none" for w in weights) and not output_only:
        bare = ", ".join(str(n) for n, w in enumerate(weights) if w.kind == "none")
        parts.append(f"; layer(s) {bare} have no norm before the attention (nothing frozen)")
    if any(w.branch_gamma is not None for w in weights) and not output_only:
        parts.append(
            "; the norm on the heads' output before the residual sum is frozen the same way"
        )
    if adapter.final_norm(probed.model) is not None:
        parts.append("; the final norm is part of the output and frozen from X_L")
    if getattr(adapter, "output_projection", lambda model: None)(probed.model) is not None:
        parts.append("; the output's bias-free projection (project_out) maps every path")
    heads = adapter.n_heads(config)
    spec = getattr(adapter, "spec", None)
    kv = spec.kv_heads_of(config, heads) if spec is not None else heads
    if kv and kv != heads:
        parts.append(
            f"; grouped-query attention: each of the {heads} query heads uses the value "
            f"projection of its key/value group ({kv} groups)"
        )
    parts.append(
        ". X_l is the output of layer l"
        + (" (the normalised output, for a post-LN family)" if post else "")
        + "; the constant gathering every bias is reported separately (constant_share) and "
        "always kept when paths are truncated."
    )
    return "".join(parts)


def _dataset(per_layer, output, models, inputs, command) -> xr.Dataset:
    first = models[0]
    L, H = first.n_layers, first.adapter.n_heads(first.config)
    k = np.arange(L + 1)
    uniform = np.full((L + 1, L + 1), np.nan)
    for layer in range(L + 1):
        for j in range(layer + 1):
            uniform[layer, j] = math.comb(layer, j) * H**j / (H + 1) ** layer
    d5 = ("init", "layer", "path_length", "sequence", "norm")
    d4 = ("init", "layer", "sequence", "norm")
    o4 = ("init", "path_length", "sequence", "norm")
    variables = {
        "share": (d5, per_layer["share"]),
        "truncation_error": (d5, per_layer["truncation_error"]),
        "effective_length": (d4, per_layer["effective_length"]),
        "constant_share": (d4, per_layer["constant_share"]),
        "reconstruction_error": (("init", "layer", "sequence"), per_layer["reconstruction_error"]),
        "uniform_share": (("layer", "path_length"), uniform),
        "uniform_mean_length": (("layer",), k * H / (H + 1)),
        "output_share": (o4, output["output_share"]),
        "output_error": (o4, output["output_error"]),
        "cosine": (("init", "path_length", "sequence"), output["cosine"]),
    }
    if "loss" in output:
        variables["loss"] = (("init", "path_length", "sequence"), output["loss"])
        variables["loss_full"] = (("init", "sequence"), output["loss_full"])
    coords = {
        "init": [m.init for m in models],
        "layer": k,
        "path_length": k,
        "sequence": np.arange(inputs.sequences),
        "norm": list(NORMS),
    }
    if (ids := inputs.token_ids()) is not None:  # what ran, kept with the result
        variables["input_ids"] = (("sequence", "token"), ids)
        coords["token"] = np.arange(ids.shape[1])
    ds = xr.Dataset(variables, coords=coords)
    long_names = {
        "share": "norm share ||V_l[k]|| / sum_j ||V_l[j]|| of the paths of length k",
        "truncation_error": "||X_l - (paths of length <= k + constant)|| / ||X_l||",
        "effective_length": "norm-weighted mean path length sum_k k share_k",
        "constant_share": "||K_l|| / ||X_l||, K_l the constant gathering every bias",
        "reconstruction_error": "||frozen X_l - real SAN+skip X_l||_F / ||real X_l||_F",
        "uniform_share": "share of paths of length k by count, C(l,k) H^k / (H+1)^l",
        "uniform_mean_length": "mean path length by count, l H / (H+1)",
        "output_share": "norm share of length k in the output",
        "output_error": "relative error of the output keeping paths of length <= k",
        "input_ids": "token ids that ran (-1: padding)",
        "cosine": "cosine of the mean-pooled output keeping paths <= k to the full one",
    }
    if "loss" in output:
        long_names["loss"] = "next-token loss (nats/token) of the tied LM head, paths <= k"
        long_names["loss_full"] = "next-token loss of the real SAN+skip output"
    for name, text in long_names.items():
        if name in ds:  # no input_ids for an image family's pixels
            ds[name].attrs["long_name"] = text
    ds["layer"].attrs["long_name"] = "layer (0 = embeddings' output); the residual stream X_l"
    adapter = first.adapter
    ds.attrs = {
        "analysis": "paths-decompose",
        **model_attrs(models, inputs),
        "variant": "SAN+skip",
        "task": "loss" if "loss" in output else "cosine",
        "frozen": frozen_note(first),
        **versions(),
        "command": command or command_line(),
        "created": utc_now(),
        "ablation_table": json.dumps(list(adapter.table)),
    }
    return ds
