"""What the model-based path analyses share: checks, loading, inputs, provenance attrs.

``check_request`` and ``load_models`` are the same steps as ``collapse.prepare``: every
number in its domain (``probe.checks``), the text read, the models loaded with the same
refusals (partial or non-finite checkpoints, configs transformers rejects, devices this
machine lacks), then the sizes against memory (``probe.memory``), all before any forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe import checks, memory
from probe.errors import ProbeError
from probe.inputs import Inputs, make_inputs, read_text
from probe.loading import ProbedModel, as_dtype, load, wrap

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


def load_models(model, init, seed, device, dtype, spread=None) -> list[ProbedModel]:
    """One ProbedModel per init, pretrained first (if its weights are missing, nothing runs).

    ``spread``: ``probe.load``'s device_map, max_memory and offload_folder, for a name
    (``probe.load`` checks them).
    """
    if isinstance(model, ProbedModel):
        if parse_inits(init) != [model.init]:
            raise ProbeError(
                f"this model is loaded with init {model.init!r}; pass init={model.init!r}"
            )
        if model.device_map and (
            device is not None or (dtype is not None and as_dtype(dtype) != model.dtype)
        ):
            raise ProbeError(
                "this model is spread with a device_map and is not moved or converted; "
                f"pass device=None and dtype={str(model.dtype).removeprefix('torch.')!r}, "
                "or load it with the dtype you want"
            )
        if model.device_map:
            return [model]
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
        load(model, init=name, seed=seed, device=device, dtype=dtype, **(spread or {}))
        for name in parse_inits(init)
    ]


def my_batches(inputs: Inputs, batch_size: int, part: tuple[int, int]) -> list:
    """The batches one part ``(rank, world_size)`` of a data-parallel run takes: a contiguous
    run of whole batches (:func:`probe.distributed.shard`), each one the single-process run
    makes, with the global sequence numbers."""
    from probe.distributed import shard

    batches = inputs.batches(batch_size)
    return batches[slice(*shard(len(batches), *part))]


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
        "world_size": 1,  # processes of a torchrun job (probe.distributed sets it)
    }


@dataclass(frozen=True)
class PixelInputs(Inputs):
    """Images for a vision family: ``input_ids`` holds pixel values (sequence, channel, h, w).

    The token count is the model's (patches + [CLS]), carried by the all-ones mask.
    """

    @property
    def tokens(self) -> int:
        return self.attention_mask.shape[1]


def path_inputs(first: ProbedModel, *, text, sequences, tokens: int, seed: int, warn) -> Inputs:
    """The inputs of a path analysis: token ids (text or seeded), or seeded noise images.

    A vision family (ViT) reads ``sequences`` images of seeded standard-normal pixels at
    the config's image size, cast to the model's dtype; its token count is fixed by the
    config (patches + 1), so ``tokens`` does not apply.
    """
    if first.adapter.inputs != "pixels":
        return make_inputs(
            first.tokenizer,
            first.config.vocab_size,
            text=text,
            sequences=sequences,
            tokens=tokens,
            seed=seed,
            warn=warn,
        )
    if text is not None:
        raise ProbeError(f"--text is for language models; {first.name} reads images")
    if not isinstance(sequences, int) or sequences < 1:
        raise ProbeError(f"--sequences must be a number >= 1 for an image model, got {sequences!r}")
    config = first.config
    size, patch = config.image_size, config.patch_size
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(sequences, config.num_channels, size, size, generator=generator)
    n_tokens = (size // patch) ** 2 + 1  # the patches and [CLS]
    mask = torch.ones(sequences, n_tokens, dtype=torch.long)
    return PixelInputs(
        pixels.to(first.dtype), mask, "seeded noise pixels", f"N(0, 1) pixels, seed {seed}", ""
    )
