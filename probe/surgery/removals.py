"""The removal variants' clean measuring pass: which sinks and massive entries a run removes.

``no-sink`` and ``no-massive`` (:mod:`probe.surgery.ablate`) are two-pass: a clean
(transformer) run of the same model over the whole corpus first finds what to remove, then
the ablated run removes it, with what was found as the parameters of the walker's edits
(:mod:`probe.models.spec`).  Everything here is deterministic: the same model, inputs and
seed find the same positions and values.

* **Sinks** (Gu et al. 2025, generalised from the first token to every key position): for
  layer l and head h, the attention key position k receives, averaged over the query rows
  the run's mask let see it (every real row under a bidirectional mask, the rows i >= k
  under a causal one, as Gu et al.'s importance score divides by T - k, the rows within W
  under a window; :func:`probe.surgery.masks.seen`), then over sequences
  (:func:`probe.measures.attention_stats.head_sums`'s ``received``; padding never counts).  (l, h, k) is a sink where it exceeds ``epsilon``
  (default 0.3, Gu et al.'s eps).  ``no-sink`` removes exactly those (layer, head, key)
  triples.
* **Massive entries** (Sun et al. 2024): for layer l's output X_l (l = 1..L; the embeddings'
  X_0 is no layer's output), the mean |X_l[s, t, d]| over the sequences whose token t is
  real, against the layer's median |entry| (the mean over sequences of each sequence's median,
  as ``massive_ratio`` defines it).  (t, d) is massive where that mean is above
  :data:`MASSIVE_RATIO` (100) times the median.  Sun et al. also ask |x| > 100, which a
  post-LN model's outputs (MiniLM's) never reach whatever their ratio; probe keeps the
  relative rule only.  ``no-massive`` sets X_l[s, t, d] to its corpus mean, the mean of
  X_l[s, t, d] over those sequences (Sun et al.'s "set to mean"), in every sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from probe.errors import ProbeError
from probe.measures.attention_stats import EPSILON, head_sums
from probe.surgery import masks
from probe.surgery.ablate import PRESETS, TRANSFORMER, Ablation
from probe.surgery.masks import Mask

#: A massive entry's mean |value| over the layer's median |entry| (Sun et al. 2024's ratio).
MASSIVE_RATIO = 100.0


@dataclass(frozen=True)
class Found:
    """What a clean run found: sinks (layer, head, key), massive (layer, token, dim, mean)."""

    sinks: tuple[tuple[int, int, int], ...] = ()
    massive: tuple[tuple[int, int, int, float], ...] = ()


def check_removal(probed, name: str) -> None:
    """A removal variant runs as walker edits: a family outside the walker refuses it, and
    no-sink a family whose attention computes its own softmax (one line each)."""
    if PRESETS[name].remove and not hasattr(probed.adapter, "sink_step"):
        raise ProbeError(
            f"the removal variants (no-sink, no-massive) need a family spec; the "
            f"{probed.adapter.family} family has its own adapter: leave them out"
        )
    if PRESETS[name].remove == "sinks":
        probed.adapter.sink_step(probed.envoy)


def find(
    probed,
    batches,
    sinks: bool,
    massive: bool,
    epsilon: float = EPSILON,
    ratio: float = MASSIVE_RATIO,
    clean: Ablation = TRANSFORMER,
    run_mask: Mask = Mask(),  # noqa: B008 (a frozen value)
) -> Found:
    """The clean run of ``probed`` over ``batches`` ((start, ids, mask) each): what to remove
    (``epsilon``, ``ratio``: the thresholds of the module docstring; ``clean``: the run the
    removals are of, the transformer or the transformer with its branches scaled;
    ``run_mask``: the mask it runs under, ``masks.effective``)."""
    adapter, root = probed.adapter, probed.envoy
    received: dict[int, torch.Tensor] = {}
    sequences = 0
    totals: dict[int, dict[str, torch.Tensor]] = {}
    for _, ids, mask in batches:
        ids, mask = ids.to(probed.device), mask.to(probed.device)
        real = mask.bool()
        sequences += ids.shape[0]
        with (
            torch.no_grad(),
            probed.tracer_root.trace(
                **adapter.model_inputs(ids, mask), **probed.trace_options
            ) as tr,
        ):
            if sinks:
                reads = adapter.paths_stream(root, tr, clean, norms=False, masks=True)
            else:
                reads = ({"x": x} for x in adapter.stream(root, tr, clean))
            for layer, values in enumerate(reads):
                if layer == 0:
                    continue
                if sinks:
                    if values["attn"] is None:
                        raise ProbeError(
                            "no-sink needs the attention probabilities; load the model with "
                            "eager attention"
                        )
                    given = values.get("mask", masks.UNREAD)
                    seen = masks.seen(run_mask, real, given, adapter.causal)
                    sums = head_sums(values["attn"], real, seen, spectrum=False)
                    got = sums["received"].cpu()
                    received[layer] = received.get(layer, 0) + got
                if massive:
                    _add(totals, layer, _hidden_sums(values["x"], real))
    found_sinks = tuple(
        (layer, int(h), int(k))
        for layer in sorted(received)
        for h, k in (received[layer] / sequences > epsilon).nonzero().tolist()
    )
    found_massive = []
    for layer in sorted(totals):
        t = totals[layer]
        count = t["count"][:, None]  # sequences whose token t is real
        seen = count > 0
        mean_abs = torch.where(seen, t["abs"] / count.clamp_min(1), 0.0)
        median = t["median"] / sequences
        for token, dim in (mean_abs > ratio * median).nonzero().tolist():
            mean = float(t["sum"][token, dim] / t["count"][token])
            found_massive.append((layer, token, dim, mean))
    return Found(found_sinks, tuple(found_massive))


def _hidden_sums(x: torch.Tensor, real: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over one batch's sequences of X[s, t, d] and |X[s, t, d]| over real tokens, the
    real count per position, and the sum of the per-sequence median |entry|."""
    keep = real.to(torch.float64)[..., None]
    x = x.to(torch.float64) * keep
    medians = sum(x[s][real[s]].abs().flatten().median() for s in range(x.shape[0]))
    return {
        "sum": x.sum(0).cpu(),
        "abs": x.abs().sum(0).cpu(),
        "count": real.sum(0).to(torch.float64).cpu(),
        "median": torch.as_tensor(medians, dtype=torch.float64).cpu(),
    }


def _add(store: dict, layer: int, sums: dict[str, torch.Tensor]) -> None:
    old = store.get(layer)
    store[layer] = sums if old is None else {k: old[k] + v for k, v in sums.items()}


def ablation(name: str, found: Found, surgery: str = "probe") -> Ablation:
    """The variant ``name`` with what the clean run found as its parameters."""
    preset = PRESETS[name].with_surgery(surgery)
    if preset.remove == "sinks":
        return replace(preset, sinks=found.sinks)
    if preset.remove == "massive":
        return replace(preset, massive=found.massive)
    return preset


def note(name: str, found: Found, init: str, learned: bool = False) -> str:
    """One line: what ``name`` removed for ``init``, or that it equals the transformer
    (``learned``: the attention has learned sink logits, which no-sink removes in every head)."""
    if name == "no-sink":
        also = "; the learned sink logits of every head removed" if learned else ""
        if not found.sinks and not learned:
            return f"no-sink ({init}): the clean run finds no sink, the variant is the transformer"
        if not found.sinks:
            return f"no-sink ({init}): the clean run finds no key sink{also}"
        keys = sorted({k for _, _, k in found.sinks})
        return (
            f"no-sink ({init}): {len(found.sinks)} (layer, head) sinks removed, at key "
            f"positions {', '.join(map(str, keys))}{also}"
        )
    if not found.massive:
        return (
            f"no-massive ({init}): the clean run finds nothing massive, the variant is the "
            "transformer"
        )
    where = sorted({(t, d) for _, t, d, _ in found.massive})
    return (
        f"no-massive ({init}): {len(found.massive)} entries replaced by their corpus mean, at "
        f"(token, dim) {', '.join(f'({t}, {d})' for t, d in where)}"
    )
