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
"""

from __future__ import annotations

import torch

from probe.loading import ProbedModel, onloaded
from probe.measures import frozen
from probe.surgery.self_test import Identity, one_line

from .path_decompose import (
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
