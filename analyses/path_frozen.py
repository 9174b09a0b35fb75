"""One batch of the path decomposition: the SAN+skip run frozen, and what each layer holds.

``frozen_run`` runs the SAN+skip variant once, reads each layer's input, attention
probabilities and norm inputs, and freezes them (``probe.measures.frozen``) into the affine network
whose output is the sum of its paths' terms; ``output_terms`` carries the last layer's terms
through a bias-free output projection.  ``layer_stats`` gives one layer's norm shares,
truncation errors, effective length and constant share (in each of ``NORMS``);
``pooled_cosine`` and ``lm_loss`` (through the family's ``logit_map``) are the task measures
of the output with only short paths kept.  ``probe.analyses.path_decompose`` runs them batch
by batch and ``probe.analyses.path_checks`` checks a family's entry with them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from probe.loading import ProbedModel, onloaded
from probe.measures import frozen, metrics
from probe.measures.overflow import check_finite, check_nonzero
from probe.surgery.ablate import SAN_SKIP

#: The norms every share and error is reported in: Frobenius and the paper's l1inf.
NORMS = ("fro", "l1inf")
#: What the SAN+skip run's reads hold, as an overflow names them (else token representations).
WHAT = {"attn": "attention probabilities"}
#: What a layer whose tokens are all zero in a sequence does to the decomposition.
ZERO_PATHS = "every share and error of its paths is 0/0"
#: The output the final norm (and projection) makes of X_L, as an all-zero one is named.
FINAL_OUTPUT = "tokens after the final norm"


def frozen_run(probed: ProbedModel, weights, input_ids, attention_mask) -> dict:
    """The SAN+skip run's X_0..X_L, the frozen layers it defines, the frozen final norm and a
    linear output projection where the model's output has them, and the real output."""
    device = probed.device
    reads: list[dict] = []  # outside the trace: nnsight keeps what the body appends
    root = probed.envoy
    with (
        torch.no_grad(),
        root.trace(
            **probed.adapter.model_inputs(input_ids.to(device), attention_mask.to(device))
        ) as tracer,
    ):
        for layer in probed.adapter.paths_stream(root, tracer, SAN_SKIP, norms=True):
            reads.append(layer)
    if len(reads) != probed.n_layers + 1:
        raise RuntimeError(f"traced {len(reads)} layers, expected {probed.n_layers + 1}")
    # An overflow stops the run (probe.measures.overflow); every entry, padding too, feeds the frozen
    # network, so all are checked; a layer's output X_l last, as the forward makes it.
    where, every = f"{probed.name} ({probed.init}, SAN+skip)", torch.tensor(True)
    real = attention_mask.bool()
    for n, r in enumerate(reads):
        for key, v in sorted(r.items(), key=lambda item: item[0] == "x"):
            if torch.is_tensor(v):
                check_finite(v, every, n, where, WHAT.get(key, "token representations"))
        # Every share and error of layer n divides by a norm of X_n or of its paths' terms.
        check_nonzero(r["x"], real, n, where, why=ZERO_PATHS)
    xs = [r["x"].to(torch.float64) for r in reads]
    layers = [
        frozen.freeze(w, r["attn"], r["norm_input"], r.get("branch_norm_input"))
        for w, r in zip(weights, reads[1:], strict=True)
    ]
    final, output = None, None
    with onloaded(probed.model):
        norm = probed.adapter.final_norm(probed.model)
        projection = getattr(probed.adapter, "output_projection", lambda model: None)(probed.model)
    if projection is not None:
        projection = projection.to(torch.float64)
    if norm is not None:
        gamma, beta, eps, *kind = norm
        kind = kind[0] if kind else "layernorm"
        final = frozen.FrozenNorm(
            gamma.to(torch.float64),
            beta.to(torch.float64),
            frozen.inverse_sigma(xs[-1], eps, kind),
            kind,
        )
    if norm is not None or projection is not None:
        # The real output: the model's own final norm (and projection) on the real X_L.
        output = probed.adapter.final_output(probed.model, reads[-1]["x"]).to(torch.float64)
        check_nonzero(output, real, len(reads) - 1, where, FINAL_OUTPUT, ZERO_PATHS)
    return {
        "x0": xs[0],
        "xs": xs,
        "layers": layers,
        "final": final,
        "projection": projection,  # (out, hidden) after the final norm, or None
        "output": output,
        "attn": [r["attn"] for r in reads[1:]],
        "norm_inputs": [r["norm_input"] for r in reads[1:]],
    }


def output_terms(run: dict, terms: torch.Tensor, const: torch.Tensor):
    """The decomposition of the model's output from the programme's last yield: OPT-350m's
    bias-free ``project_out`` maps every path's term and the constant; elsewhere as they are."""
    if run["projection"] is None:
        return terms, const
    return terms @ run["projection"].T, const @ run["projection"].T


def layer_stats(terms: torch.Tensor, const: torch.Tensor, real: torch.Tensor | None) -> dict:
    """Shares, truncation errors and effective length of one layer's decomposition.

    ``terms`` (k, batch, token, hidden), ``const`` (batch, token, hidden); arrays
    come back as (k, batch, norm) or (batch, norm); ``real`` adds the
    reconstruction error against the real run.
    """
    full = terms.sum(0) + const
    term_norms = _norms(terms)  # (k, batch, norm)
    share = term_norms / term_norms.sum(0, keepdim=True)
    lengths = torch.arange(terms.shape[0], dtype=torch.float64, device=terms.device)[:, None, None]
    full_norm = _norms(full)  # (batch, norm)
    partial = torch.cumsum(terms, 0) + const
    stats = {
        "share": share.cpu().numpy(),
        "truncation_error": (_norms(partial - full) / full_norm).cpu().numpy(),
        "effective_length": (lengths * share).sum(0).cpu().numpy(),
        "constant_share": (_norms(const) / full_norm).cpu().numpy(),
    }
    if real is not None:
        stats["reconstruction_error"] = (
            (metrics.matrix_norm(full - real, "fro") / metrics.matrix_norm(real, "fro"))
            .cpu()
            .numpy()
        )
    return stats


def _norms(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([metrics.matrix_norm(x, norm) for norm in NORMS], -1)


def pooled_cosine(partial: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Cosine of the token-mean of each partial output (k, batch, ...) to the full one's."""
    a, b = partial.mean(-2), full.mean(-2)  # (k, batch, hidden), (batch, hidden)
    return torch.nn.functional.cosine_similarity(a, b.expand_as(a), dim=-1)


def logit_map(adapter, config) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What the family's LM does to ``hidden @ head^T`` (its entry's ``logits``), or None."""
    spec = getattr(adapter, "spec", None)
    if spec is None or not spec.logits.fields():
        return None
    return functools.partial(spec.logits.apply, config)


def lm_loss(
    outputs: torch.Tensor,
    head: torch.Tensor,
    input_ids: torch.Tensor,
    to_logits: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Next-token cross-entropy (nats/token) of logits = output head^T, per (k, sequence).

    ``to_logits`` maps them as the family's LM does first (:func:`logit_map`).
    The vocabulary projection runs in float32, one (token, vocab) block at a
    time: it is a task measure, and float64 blocks of 50k logits cost 2x for nothing.
    """
    head32 = head.to(torch.float32)
    targets = input_ids[:, 1:].to(head.device)
    loss = torch.empty(outputs.shape[:2], dtype=torch.float64)
    for k in range(outputs.shape[0]):
        for b in range(outputs.shape[1]):
            logits = outputs[k, b, :-1].to(torch.float32) @ head32.T  # (token-1, vocab)
            if to_logits is not None:
                logits = to_logits(logits)
            loss[k, b] = torch.nn.functional.cross_entropy(logits, targets[b]).double()
    return loss


def reconstruction_tolerance(dtype: torch.dtype, layers: int) -> float:
    """How far the frozen network may be from the real SAN+skip run (relative, Frobenius).

    The frozen network repeats the real run's operations in float64 on the real run's own
    reads, so what separates them is the real run's rounding: a few units of its dtype's
    machine epsilon per layer, and never less than float32's, since HF's RMS norms compute
    in float32 even in a float64 model (measured ~1e-7 at 3 layers, see the module
    docstring).  64 units per layer leaves room for depth; a mistake in a family's entry
    (a wrong Heads layout: 0.64, a bias or a norm left out: 1e-2 and more) is far above it.
    bfloat16's epsilon is 2^-7, so there the bound is capped at 0.25: only gross mistakes
    are told from bfloat16's own rounding.
    """
    eps = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)
    return min(64 * eps * (layers + 1), 0.25)
