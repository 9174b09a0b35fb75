"""What ``probe check`` asks of the path decomposition on one model, beside the self-test.

Two capabilities of a family's entry are used only by the path decomposition, and each is
checked here without the entry's own reads:

* **the frozen network is the run**: the decomposition (the entry's ``heads``, ``norm``,
  ``branch_norm``, ``residual_multiplier``) rebuilds every layer of the real SAN+skip run
  to the rounding of its dtype (:func:`~probe.analyses.path_decompose.reconstruction_tolerance`);
* **the loss is the model's own**: with a tied LM head, the loss probe computes from the
  last layer (the entry's ``final_norm``, ``output``, ``lm_head`` and ``logits``) equals the
  loss of the family's own ``*ForCausalLM`` built around the very same base model (its
  tensors shared, nothing copied), as transformers computes it, to float32 logits' rounding.

They decide, in this one place, what an analysis may read of a model: ``probe check`` prints
them, and :func:`require` holds every analysis that reads the heads (the path decomposition,
the theory panel) or the LM head (the decomposition's loss) to the same identity on the
same short seeded input, refusing in one line naming the entry's field.  A pass is
remembered like the self-test's (the identities depend on the code and the architecture,
not on the weights).
"""

from __future__ import annotations

import torch

from probe.loading import ProbedModel, onloaded
from probe.measures import frozen
from probe.surgery.self_test import Identity, one_line

from .path_frozen import (
    frozen_run,
    layer_stats,
    lm_loss,
    logit_map,
    reconstruction_tolerance,
)

#: Both losses take the cross-entropy of float32 logits: a few float32 units apart.
LOSS_TOLERANCE = 1e-5


def decomposition_identities(probed: ProbedModel, ids, mask) -> list[Identity]:
    """The rows ``probe check`` adds for the path decomposition (none where the family has
    none)."""
    if probed.adapter.not_decomposable or probed.adapter.inputs != "ids":
        return []
    found = [_reconstruction(probed, ids, mask)]
    with onloaded(probed.model):
        head = probed.adapter.lm_head(probed.model)
    if head is not None:
        found.append(_loss(probed, ids, mask, head))
    return found


#: What an analysis may read, each held to one identity of this module.
PARTS = ("heads", "lm_head")


def problem(probed: ProbedModel, part: str) -> str:
    """Why an analysis may not read ``part`` (one of :data:`PARTS`) of ``probed``: the failing
    identity in one line naming the entry's field; "" where it holds, where the model has no
    such part (no LM head), or where the decomposition does not apply (the Fastformer, a
    model of images: the theory panel says what it leaves out)."""
    if part not in PARTS:
        raise ValueError(f"part {part!r} is not one of {PARTS}")
    if probed.adapter.not_decomposable or probed.adapter.inputs != "ids":
        return ""
    marker = _marker(probed, part)
    if marker is not None and marker.exists():
        return ""
    from probe.surgery.self_test import remember, short_input

    ids, mask = short_input(probed)
    ids, mask = ids.cpu(), mask.cpu()
    if part == "lm_head":
        with onloaded(probed.model):
            head = probed.adapter.lm_head(probed.model)
        if head is None:
            return ""
        identity = _loss(probed, ids, mask, head)
    else:
        identity = _reconstruction(probed, ids, mask)
    eps = torch.finfo(probed.dtype).eps if probed.dtype.is_floating_point else 0.0
    if identity.holds(64 * eps):
        remember(marker)
        return ""
    if _the_models_numbers(identity):  # the analysis meets them and says so in its own line
        return ""
    what = identity.error or f"off by {identity.max_diff:.3g} (bound {identity.bound:.3g})"
    return (
        f"{probed.name}: the {probed.family} entry's {identity.field} does not describe this "
        f"model: {identity.name} fails ({what}); `probe check` shows every identity"
    )


def _the_models_numbers(identity: Identity) -> bool:
    """Whether a failed identity failed on the model's numbers, not on the entry: a layer no
    statistic can be computed from (zeros, NaN or inf: ``NothingToMeasure``), or a run that
    overflowed to NaN or inf."""
    import math

    from probe.errors import NothingToMeasure

    if identity.error:
        return identity.error.startswith(f"{NothingToMeasure.__name__}: ")
    return not math.isfinite(identity.max_diff)


def require(probed: ProbedModel, *parts: str) -> None:
    """Refuse, in one line, a model whose ``parts`` an analysis may not read (:func:`problem`)."""
    from probe.errors import ProbeError

    for part in parts:
        if why := problem(probed, part):
            raise ProbeError(why)


def _marker(probed: ProbedModel, part: str):
    """The file whose presence says ``part`` passed on this architecture, or None: the
    self-test's key and the sources of these identities (this module, the frozen run)."""
    import sys

    from probe.surgery.self_test import marker

    from . import path_frozen

    sources = tuple(m.__file__ for m in (sys.modules[__name__], path_frozen, frozen))
    return marker(probed, part, sources)


def _reconstruction(probed: ProbedModel, ids, mask) -> Identity:
    name = "path decomposition = the SAN+skip run"
    bound = reconstruction_tolerance(probed.dtype, probed.n_layers)
    try:
        with onloaded(probed.model):
            weights = [
                probed.adapter.layer_weights(probed.model, n) for n in range(probed.n_layers)
            ]
        run = frozen_run(probed, weights, ids, mask)
        worst = 0.0
        steps = frozen.iter_path_terms(run["layers"], run["x0"], run["final"])
        for layer, (terms, const) in enumerate(steps):
            if layer <= probed.n_layers:
                error = layer_stats(terms, const, run["xs"][layer])["reconstruction_error"]
                worst = max(worst, float(torch.as_tensor(error).max()))
    except Exception as err:
        return Identity(name, float("inf"), 1.0, error=one_line(err), field="heads")
    return Identity(name, worst, 1.0, field="heads", bound=bound)


def _loss(probed: ProbedModel, ids, mask, head) -> Identity:
    name = "path decomposition's loss = the *ForCausalLM loss"
    try:
        want = _hf_loss(probed, ids, mask)
        with torch.no_grad():
            inputs = probed.adapter.model_inputs(ids.to(probed.device), mask.to(probed.device))
            last = probed.model(**inputs).last_hidden_state
        got = lm_loss(last[None], head, ids, logit_map(probed.adapter, probed.config))[0]
        got = float(got.mean())
    except Exception as err:
        return Identity(name, float("inf"), 1.0, error=one_line(err), field="logits")
    return Identity(
        name, abs(got - want), max(abs(want), 1.0), field="logits", bound=LOSS_TOLERANCE
    )


def _hf_loss(probed: ProbedModel, ids, mask) -> float:
    """transformers' own next-token loss of the model, its causal LM built on the meta device
    around the same base model and the same tied embedding (no tensor copied)."""
    import transformers

    with torch.device("meta"):
        lm = transformers.AutoModelForCausalLM.from_config(
            probed.config, attn_implementation=probed.config._attn_implementation
        )
    setattr(lm, lm.base_model_prefix, probed.model)
    embedding = probed.model.get_input_embeddings().weight
    output = lm.get_output_embeddings()
    output.weight = embedding
    if getattr(output, "bias", None) is not None:
        raise ValueError("the LM head has a bias: not a tied embedding alone")
    if any(t.is_meta for t in lm.parameters()):
        raise ValueError("the causal LM holds weights outside its base model and tied head")
    lm.eval()
    inputs = probed.adapter.model_inputs(ids.to(probed.device), mask.to(probed.device))
    with torch.no_grad():
        return float(lm(**inputs, labels=inputs["input_ids"]).loss)
