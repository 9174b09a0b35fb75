"""Chained attention along sampled paths (Dong, Cordonnier & Loukas 2021, Sections 2.2-2.3).

A path of depth d picks d distinct layers l_1 < ... < l_d and one head in each.
Along it the attention matrices of one sequence multiply, in one of two orders
(coordinate ``order``):

    "earliest-left":  P = A^{l_1}_{h_1} ... A^{l_d}_{h_d}   (the paper's notebook)
    "latest-left":    P = A^{l_d}_{h_d} ... A^{l_1}_{h_1}   (the map the path applies
                                                            to the tokens, Section 2.2)

Every A is row-stochastic, so P is too; the paper shows that such a product
approaches a rank-one matrix 1 p^T doubly exponentially in d.  For every depth
d = 1..L this module draws ``samples`` paths uniformly among the C(L,d) H^d of
that depth (and a sequence uniformly), takes the attention probabilities of a
real forward pass of the unablated model, and measures

    ||P - rank1_SVD(P)|| / ||P||                              (fit "svd")
    ||P - 1 p^T|| / ||P||       p = the mean row of P         (fit "mean")

in every norm of ``probe.measures.metrics`` (the composite l1inf norm is the paper's).
The paper's notebook (``walking_casual_transformers.ipynb``: 100 paths per
depth, 32 sequences of 128 tokens, BERT-base) plots the distance to the best
rank-one fit of the earliest-left product; that is the headline of the report,
the printed table and the fitted order, with the mean-row distance beside it.
The same seed gives the same paths for every init, so pretrained and random
weights are compared on identical samples.  Only the attention slices the
samples need leave the trace; products are formed in float64.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from probe.errors import ProbeError
from probe.files.results import command_line, utc_now, versions
from probe.loading import ProbedModel
from probe.measures import metrics
from probe.measures.overflow import check_finite, check_nonzero
from probe.measures.path_vocabulary import SKIP, count_by_length, path_str, random_path
from probe.measures.path_vocabulary import Path as PathTuple
from probe.names import ORDERS
from probe.requests import checks
from probe.requests.request import Inputs, Model
from probe.surgery.ablate import TRANSFORMER

from .path_common import model_attrs, my_batches
from .preamble import begin

Progress = Callable[[int, int, str], None]
"""A progress callback: called with (batches done, batches in all, a label)."""


def sample(
    model: Model | str | Path | ProbedModel | torch.nn.Module,
    inputs: Inputs | None = None,
    *,
    samples: int = 100,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
    command: str | None = None,
    part: tuple[int, int] = (0, 1),
    **flat,
) -> xr.Dataset:
    """Distance from rank one of attention products along sampled paths (module docstring).

    Parameters
    ----------
    model
        A [`probe.Model`][probe.requests.request.Model], or what one holds: a hub id, a local
        folder, `minilm`, an `nn.Module` or a loaded
        [`ProbedModel`][probe.loading.ProbedModel] (then only its own init is run).
    inputs
        A [`probe.Inputs`][probe.requests.request.Inputs]; unset sizes default to 32 sequences of
        128 tokens in batches of 8.  Not `images` (the path analyses read seeded noise
        images).
    samples
        Paths drawn per depth, at least 1.
    progress
        Called after each batch with (batches done, batches in all, a label naming the
        init); None: silent.
    warn
        Called with one line when the text or image folder holds fewer sequences than
        asked (the run uses those); None: no warnings.
    command
        The "reproduce with" line the result records; None: this process's command line.
    part
        `(rank, world_size)`: compute only the samples whose sequence lies in this rank's
        share of the batches (a contiguous run of whole batches); the others stay NaN, and
        the parts of all ranks, reduced over ranks with NaN skipped, are the
        single-process result bit for bit (`probe.distributed.merge_parts`).
    **flat
        The request's keywords beside a model name (`init=`, `tokens=`, ...), the same
        request as `Model(name, ...)` and `Inputs(...)`; not together with them.

    Returns
    -------
    xarray.Dataset
        `ratio` over (init, order, depth, sample, fit, norm), with the paths drawn and
        the token ids that ran; attributes that say how it was made.

    Raises
    ------
    ProbeError
        A request that cannot run (`sequences="all"`, `images`, more tokens than the
        model takes, more samples than a depth has distinct (path, sequence) pairs, too
        little memory), attention probabilities that overflowed to NaN or inf, or
        degenerate weights (a layer an attention reads all zero in a sequence).
    """
    checks.integer("`samples`", samples, 1)

    def drawn_bytes(models: list[ProbedModel], given: Inputs) -> int:
        # The drawn paths' attention slices and products (float64), and the result array.
        L, tokens = models[0].n_layers, given.tokens
        drawn = L * samples * (tokens * tokens * (8 + models[0].dtype.itemsize) + 64)
        return drawn + len(models) * L * samples * len(metrics.FITS) * len(metrics.NORMS) * 8

    sizes = {"sequences": 32, "tokens": 128, "batch_size": 8}
    begun = begin(model, inputs, flat, sizes=sizes, check=drawn_bytes, warn=warn, noise_images=True)
    request, models, first, inputs = begun.request, begun.models, begun.first, begun.inputs
    batch_size = begun.given.batch_size
    L, H = first.n_layers, first.adapter.path_heads(first.config)
    _check_samples(samples, L, H, inputs.sequences)
    drawn = draw(L, H, samples, inputs.sequences, request.seed)
    shape = (len(models), len(ORDERS), L, samples, len(metrics.FITS), len(metrics.NORMS))
    ratio = np.full(shape, np.nan)
    chunks = my_batches(inputs, batch_size, part)
    total, done = len(models) * len(chunks), 0
    for i, probed in enumerate(models):
        for start, ids, mask in chunks:
            stop = start + ids.shape[0]
            mine = [
                (d, s, path, seq - start)
                for d, row in enumerate(drawn)
                for s, (path, seq) in enumerate(row)
                if start <= seq < stop
            ]
            if mine:
                chosen = [(p, q) for _, _, p, q in mine]
                for o, products in enumerate(chains(probed, ids, mask, chosen, ORDERS)):
                    values = metrics.collapse_metrics(products)["relative_residual"]
                    for (d, s, _, _), value in zip(mine, values.cpu().numpy(), strict=True):
                        ratio[i, o, d, s] = value
            done += 1
            if progress is not None:
                progress(done, total, f"{probed.init} attention")
    return _dataset(ratio, drawn, models, inputs, samples, command)


def _check_samples(samples: int, layers: int, heads: int, sequences: int) -> None:
    """More draws than a depth has distinct (path, sequence) pairs only repeat them: the
    result grows without telling more (a model with 4 paths once wrote 264 MB)."""
    counts = count_by_length(layers, heads)[1:]  # depths 1..L
    fewest = min(counts)
    depth = counts.index(fewest) + 1
    pairs = fewest * sequences
    if samples > pairs:
        raise ProbeError(
            f"`samples` {samples} is more than the {pairs} distinct (path, sequence) pairs of "
            f"depth {depth} ({fewest} paths x {sequences} sequences); use `samples` {pairs} "
            "or fewer, or more `sequences`"
        )


def draw(layers: int, heads: int, samples: int, sequences: int, seed: int):
    """Per depth d = 1..L, ``samples`` (path, sequence) pairs, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [
        [(random_path(layers, heads, d, rng), rng.randrange(sequences)) for _ in range(samples)]
        for d in range(1, layers + 1)
    ]


#: What a layer whose tokens are all zero in a sequence does to the attention after it.
SEES_NO_TOKEN = (
    "the next layer's attention sees no token (its probabilities are set by the positions alone)"
)


def attention_slices(
    probed: ProbedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    wanted: list[list[tuple[int, int]]],
) -> list[torch.Tensor]:
    """Per layer l, the attention matrices (n_l, token, token) of the (sequence, head) pairs ``wanted[l]``.

    Only these slices leave the trace (reduction next to the model).
    """
    device = probed.device
    index = [
        (
            torch.tensor([s for s, _ in pairs], dtype=torch.long, device=device),
            torch.tensor([h for _, h in pairs], dtype=torch.long, device=device),
        )
        for pairs in wanted
    ]
    picked: list[torch.Tensor] = []  # outside the trace: nnsight keeps what the body appends
    root = probed.envoy
    real, scope = attention_mask.to(device).bool(), f"{probed.name} ({probed.init})"
    with (
        torch.no_grad(),
        root.trace(
            **probed.adapter.model_inputs(input_ids.to(device), attention_mask.to(device))
        ) as tracer,
    ):
        layer = 0
        stream = probed.adapter.paths_stream(root, tracer, TRANSFORMER, norms=False)
        for n, reads in enumerate(stream):
            if n < probed.n_layers:  # X_n, which the attention of layer n + 1 reads
                check_nonzero(reads["x"], real, n, scope, why=SEES_NO_TOKEN)
            if "attn" not in reads:
                continue  # X_0
            seqs, heads = index[layer]
            picked.append(reads["attn"][seqs, heads])  # (n_l, token, token)
            layer += 1
    if len(picked) != probed.n_layers:
        raise RuntimeError(f"traced {len(picked)} attention layers, expected {probed.n_layers}")
    return picked


def chain(
    probed: ProbedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    paths: list[tuple[PathTuple, int]],
    order: str = "latest-left",
) -> torch.Tensor:
    """P (float64, (n, token, token)) for each (path, sequence in batch), multiplied in ``order``.

    "latest-left": P = A_{l_d} ... A_{l_1}; "earliest-left": P = A_{l_1} ... A_{l_d}."""
    (products,) = chains(probed, input_ids, attention_mask, paths, (order,))
    return products


def chains(
    probed: ProbedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    paths: list[tuple[PathTuple, int]],
    orders: tuple[str, ...] = ORDERS,
) -> list[torch.Tensor]:
    """:func:`chain` in each of ``orders``, from one forward pass."""
    for order in orders:
        if order not in ORDERS:
            raise ProbeError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")
    L = probed.n_layers
    wanted: list[list[tuple[int, int]]] = [[] for _ in range(L)]
    where: dict[tuple[int, int, int], int] = {}
    for path, seq in paths:
        for layer, head in enumerate(path):
            if head is not SKIP and (layer, seq, head) not in where:
                where[layer, seq, head] = len(wanted[layer])
                wanted[layer].append((seq, head))
    slices = attention_slices(probed, input_ids, attention_mask, wanted)
    # An overflow stops the run (probe.measures.overflow); every entry, padding too, enters a product.
    scope, every = f"{probed.name} ({probed.init})", torch.tensor(True)
    for layer, picked in enumerate(slices):  # slices[l]: layer l + 1 (0 = the embeddings)
        check_finite(picked, every, layer + 1, scope, "attention probabilities")
    tokens = attention_mask.shape[1]  # ids or an image's patches: the mask has every token
    outs = [torch.empty((len(paths), tokens, tokens), dtype=torch.float64) for _ in orders]
    for n, (path, seq) in enumerate(paths):
        along = [
            slices[layer][where[layer, seq, head]].to("cpu", torch.float64)
            for layer, head in enumerate(path)
            if head is not SKIP
        ]  # the path's attention matrices, earliest layer first
        for out, order in zip(outs, orders, strict=True):
            product = torch.eye(tokens, dtype=torch.float64)
            for a in along:
                product = product @ a if order == "earliest-left" else a @ product
            out[n] = product
    return outs


def _dataset(ratio, drawn, models, inputs, samples, command) -> xr.Dataset:
    first = models[0]
    L = first.n_layers
    depth = np.arange(1, L + 1)
    coords = {
        "init": [m.init for m in models],
        "order": list(ORDERS),
        "depth": depth,
        "sample": np.arange(samples),
        "fit": list(metrics.FITS),
        "norm": list(metrics.NORMS),
        "path": (("depth", "sample"), np.array([[path_str(p) for p, _ in row] for row in drawn])),
        "sequence": (("depth", "sample"), np.array([[q for _, q in row] for row in drawn])),
    }
    ds = xr.Dataset(
        {"ratio": (("init", "order", "depth", "sample", "fit", "norm"), ratio)},
        coords=coords,
    )
    ds["ratio"].attrs["long_name"] = (
        "||P - rank1(P)|| / ||P|| of the attention product along a path (fit svd: the best "
        "rank-one fit; fit mean: 1 p^T, p the mean row)"
    )
    ds["order"].attrs["long_name"] = (
        "earliest-left: P = A_l1 ... A_ld (the paper's notebook); "
        "latest-left: P = A_ld ... A_l1 (the map the path applies to the tokens)"
    )
    ds["path"].attrs["long_name"] = (
        "the sampled path, one entry per layer: 's' (not on the path) or the head index"
    )
    ds["sequence"].attrs["long_name"] = (
        "index of the input sequence the path was taken in (along input_sequence)"
    )
    ids = inputs.token_ids()
    if ids is not None:  # pixels have no token ids: the inputs attr describes the images
        ds["input_ids"] = (("input_sequence", "token"), ids)
        ds["input_ids"].attrs["long_name"] = "the token ids that ran (-1 at padding)"
    ds.attrs = {
        "analysis": "paths-sample",
        **model_attrs(models, inputs),
        "samples": samples,
        "variant": "transformer",
        "headline": "fit svd, order earliest-left, norm l1inf (the paper's notebook)",
        **versions(),
        "command": command or command_line(),
        "created": utc_now(),
        "ablation_table": json.dumps(list(first.adapter.table)),
    }
    return ds
