"""What the model-based path analyses share: checks, loading, provenance attrs.

``check_request`` and ``load_models`` are the same steps as ``collapse.prepare``: every
number in its domain (``probe.checks``), the text read, the models loaded with the same
refusals (partial or non-finite checkpoints, configs transformers rejects, devices this
machine lacks), then the sizes against memory (``probe.memory``), all before any forward.
"""

from __future__ import annotations

from probe import checks, memory
from probe.errors import ProbeError
from probe.inputs import Inputs, read_text
from probe.load import ProbedModel, load, wrap

from .collapse import parse_inits


def check_request(text, sequences: int, tokens: int, batch_size: int, seed: int) -> None:
    """The settings of a run, checked before any model is loaded."""
    checks.integer("--batch-size", batch_size, 1)
    checks.integer("--sequences", sequences, 1)
    checks.integer("--tokens", tokens, 2)
    checks.integer("--seed", seed, 0, checks.MAX_SEED)
    if text is not None:
        read_text(text)  # a bad --text fails before any model is loaded


def check_run(probed: ProbedModel, sequences: int, tokens: int, batch: int, extra: int = 0):
    """The model's token limit, then the run's memory (inputs, one batch, ``extra``)."""
    check_tokens(probed, tokens)
    memory.require_run(probed, sequences, tokens, batch, extra)


def load_models(model, init, seed, device, dtype) -> list[ProbedModel]:
    """One ProbedModel per init, pretrained first (if its weights are missing, nothing runs)."""
    if isinstance(model, ProbedModel):
        if parse_inits(init) != [model.init]:
            raise ProbeError(
                f"this model is loaded with init {model.init!r}; pass init={model.init!r}"
            )
        if dtype is not None or device is not None:
            return [
                wrap(
                    model.model,
                    name=model.name,
                    tokenizer=model.tokenizer,
                    init=model.init,
                    seed=model.seed,
                    device=device,
                    dtype=dtype,
                )
            ]
        return [model]
    if not isinstance(model, str) and hasattr(model, "config"):
        return [
            wrap(
                model,
                init=init if init != "both" else "pretrained",
                seed=seed,
                device=device,
                dtype=dtype,
            )
        ]
    return [
        load(model, init=name, seed=seed, device=device, dtype=dtype) for name in parse_inits(init)
    ]


def check_tokens(probed: ProbedModel, tokens: int) -> None:
    limit = probed.adapter.max_tokens(probed.config)
    if limit is not None and tokens > limit:
        raise ProbeError(
            f"{probed.name} takes at most {limit} tokens per sequence; use --tokens {limit} or fewer"
        )


def model_attrs(models: list[ProbedModel], inputs: Inputs) -> dict:
    first = models[0]
    return {
        "model": first.name,
        "family": first.family,
        "config": first.config.to_json_string(use_diff=True),
        "weights": "; ".join(f"{m.init}: {m.weights}" for m in models),
        "inputs": inputs.kind,
        "text_source": inputs.text_source,
        "text_sha256": inputs.text_sha256,
        "sequences": inputs.sequences,
        "tokens": inputs.tokens,
        "seed": first.seed,
        "dtype": str(first.dtype).removeprefix("torch."),
        "device": str(first.device),
        "n_layers": first.n_layers,
        "n_heads": first.adapter.n_heads(first.config),
        "hidden_size": first.adapter.hidden_size(first.config),
    }
