"""probe's attention core against the model's own attention function, on what it receives.

probe computes attention itself in two places: ``probe_eager`` (float64 runs of families
whose eager softmax is float32) and ``probe_masked`` (every mask of probe's: ``probe_eager``
with the run's mask).  The self-test's other identities run every side through whatever
core the model uses, so a feature probe's core left out (a soft-cap, a relative position
bias, a scaling of the model's own, learned sink logits) would be left out on both sides
alike and nothing would notice.  This identity compares the core with the attention
function the model's own modelling code defines (its module's ``eager_attention_forward``,
as transformers ships it), call by call:

* one short forward of the model records every call of its attention function (every
  layer, so every layer type and config branch the model has: sliding and full layers,
  soft-capped or not), each call's query, key, value, mask and keywords;
* each call goes through both functions in float64, once as recorded and once with its
  queries 8 times larger (a soft-cap or a sink logit that small scores hide then matters);
* the outputs and the probabilities must agree to the rounding of the model's own softmax,
  which transformers may run in float32 in a float64 model: each probability within
  2^-24 of its own, so the probabilities within 4 (T + 1) 2^-24 and the outputs within
  4 (T + 1) 2^-24 max|v| (T keys), where a feature left out moves them by its own size.

A keyword the call passes that probe's core does not read is named in the refusal.  A
family whose attention computes its own softmax (BLOOM, Falcon, DeBERTa-v2, XLNet) never
calls an attention function: probe's core never runs on it, and there is nothing to check.
"""

from __future__ import annotations

import inspect
import sys

import torch

from probe.surgery.identity import Identity

#: The identity's name, as ``probe check`` shows it.
CORE = "probe's attention = the model's own"
#: The keywords probe's core reads beyond its signature (T5's ``position_bias``), or that
#: change nothing it computes (the mask already holds a sliding window; ids, caches and flags
#: are the model's bookkeeping).
KNOWN = frozenset(
    {
        "position_bias",
        "sliding_window",
        "position_ids",
        "use_cache",
        "cache_position",
        "output_attentions",
        "is_causal",
        "head_mask",
        "layer_idx",
        "past_key_values",
        "past_key_value",
    }  # fmt: skip
)
#: The queries' factor of the second comparison.
LOUDER = 8.0
NAME = "probe_capture"


def identity(probed, data: torch.Tensor, mask: torch.Tensor):
    """The identity on one batch: an :class:`probe.surgery.identity.Identity`, with ``error``
    naming the family, the layer and any keyword probe's core does not read where it fails."""
    from probe.models.attention import probe_eager

    calls = _calls(probed, data, mask)
    reads = set(inspect.signature(probe_eager).parameters) - {"kwargs"}  # and `KNOWN`
    if not calls:
        return Identity(CORE, 0.0, 0.0, "(its attention computes its own softmax) ", field="")
    worst, where, unread = None, "", set()  # (difference, allowance, size)
    for layer, (module, arguments, own) in enumerate(calls, start=1):
        given = {k for k, v in arguments.items() if v is not None}
        unread |= given - KNOWN - reads
        for factor in (1.0, LOUDER):
            found = _compare(module, arguments, own, factor)
            if worst is None or found[0] / found[1] > worst[0] / worst[1]:
                worst, where = found, f"at layer {layer} "
    diff, allowed, size = worst
    if diff <= allowed:
        return Identity(CORE, diff, size, where, field="", bound=allowed)
    named = f"; its attention function also takes {', '.join(sorted(unread))}" if unread else ""
    error = (
        f"{probed.name}: probe's attention core does not compute what the {probed.family} "
        f"attention computes {where}(off by {diff:.3g}, allowed {allowed:.3g}){named}; probe "
        "cannot run this family's attention itself, so it is refused"
    )
    return Identity(CORE, diff, size, where, error=error, field="", bound=allowed)


def _calls(probed, data, mask) -> list[tuple[torch.nn.Module, dict, object]]:
    """Every call of the model's attention function in one forward: (module, its arguments
    by name, the model's own eager function)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    from probe.models.attention import probe_eager

    calls: list = []  # a family without the function to check against is not checked

    def capture(module, query, key, value, attention_mask, *args, **kwargs):
        own = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        run = own if own is not None else probe_eager
        bound = inspect.signature(run).bind(module, query, key, value, attention_mask, *args,
                                            **kwargs)  # fmt: skip
        named = {k: v for k, v in bound.arguments.items() if k != "kwargs"}
        named |= bound.arguments.get("kwargs", {})
        if own is not None:
            calls.append((module, named, own))
        return run(module, query, key, value, attention_mask, *args, **kwargs)

    AttentionInterface.register(NAME, capture)
    AttentionMaskInterface.register(NAME, eager_mask)
    config = probed.model.config
    saved = config._attn_implementation
    try:
        config._attn_implementation = NAME
        with torch.no_grad():
            probed.model(**probed.adapter.model_inputs(data, mask))
    except Exception:  # the model does not run so: the clean identity says why
        return []
    finally:
        config._attn_implementation = saved
    return calls


def _compare(module, arguments: dict, own, factor: float) -> tuple[float, float, float]:
    """(difference, allowance, size) of the outputs or of the probabilities, whichever is
    the larger share of its allowance: both functions on the call's arguments in float64,
    the queries times ``factor``."""
    from probe.models.attention import probe_eager

    wide = {k: _float64(v) for k, v in arguments.items()}
    wide["query"] = wide["query"] * factor
    try:
        with torch.no_grad():
            theirs = own(**wide)
            ours = probe_eager(**{k: v for k, v in wide.items() if k != "module"}, module=module)
    except Exception:  # the core cannot even take what the model's attention takes
        return float("inf"), 1.0, 1.0
    if ours[0].shape != theirs[0].shape or ours[1].shape != theirs[1].shape:
        return float("inf"), 1.0, 1.0
    if not (bool(theirs[0].isfinite().all()) and bool(wide["value"].isfinite().all())):
        return 0.0, 1.0, 0.0  # the model's own numbers overflowed: the clean identity says so
    rounding = 4 * (wide["key"].shape[-2] + 1) * 2.0**-24  # the own softmax's, in float32
    size = float(wide["value"].abs().max())
    out = float((ours[0] - theirs[0].to(torch.float64)).abs().max())
    probs = float((ours[1] - theirs[1].to(torch.float64)).abs().max())
    out_allowed = rounding * max(size, 1e-300)
    if out / out_allowed >= probs / rounding:
        return out, out_allowed, size
    return probs, rounding, 1.0


def _float64(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    return value
