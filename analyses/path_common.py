"""What the model-based path analyses share: their request, inputs, checks, provenance.

A path analysis takes the request every analysis takes (:mod:`probe.request`: the model
and its inputs, each checked when it is built) and loads it as ``collapse`` does, with the
same refusals (partial or non-finite checkpoints, configs transformers rejects, devices
this machine lacks); then the sizes are checked against memory (``probe.memory``), all
before any forward.
"""

from __future__ import annotations

import torch

from probe import memory
from probe.errors import ProbeError
from probe.inputs import Encoded, make_inputs, passed_inputs
from probe.loading import ProbedModel
from probe.preflight import check_tokens
from probe.request import Inputs, Model, coerce, provenance


def check_run(probed: ProbedModel, sequences: int, tokens: int, batch: int, extra: int = 0):
    """The model's token limit, then the run's memory (inputs, one batch, ``extra``)."""
    check_tokens(probed, tokens)
    memory.require_run(probed, sequences, tokens, batch, extra)


def request_of(model, inputs: Inputs | None, flat: dict, **defaults) -> tuple[Model, Inputs]:
    """The request of a path analysis (:func:`probe.request.coerce`), with its default sizes
    (``defaults``: sequences, tokens, batch_size, dtype) where none were given."""
    request, given = coerce(model, inputs, flat)
    request = request.with_defaults(dtype=defaults.pop("dtype", None))
    given = given.with_defaults(**defaults)
    if given.sequences == "all":
        raise ProbeError("`sequences` 'all' is for collapse; give a number of sequences")
    if given.images is not None or (given.ids is not None and given.ids.dim() == 4):
        raise ProbeError("the path analyses read seeded noise images; leave `images` out")
    return request, given


def my_batches(inputs: Encoded, batch_size: int, part: tuple[int, int]) -> list:
    """The batches one part ``(rank, world_size)`` of a data-parallel run takes: a contiguous
    run of whole batches (:func:`probe.distributed.shard`), each one the single-process run
    makes, with the global sequence numbers."""
    from probe.distributed import shard

    batches = inputs.batches(batch_size)
    return batches[slice(*shard(len(batches), *part))]


def model_attrs(models: list[ProbedModel], encoded: Encoded) -> dict:
    """The provenance attributes of a path result (:func:`probe.request.provenance`)."""
    return provenance(models, encoded) | {"world_size": 1}  # torchrun sets its own


def path_inputs(first: ProbedModel, given: Inputs, seed: int, warn) -> Encoded:
    """The inputs of a path analysis: token ids (text, seeded, or passed), or seeded noise
    images.

    A vision family (ViT) reads ``sequences`` images of seeded standard-normal pixels at
    the config's image size, cast to the model's dtype; its token count is fixed by the
    config (patches + 1), so ``tokens`` does not apply.
    """
    if first.adapter.inputs != "pixels":
        if given.ids is not None:
            return passed_inputs(first, given.ids)
        return make_inputs(
            first.tokenizer,
            first.config.vocab_size,
            text=given.text,
            sequences=given.sequences,
            tokens=given.tokens,
            seed=seed,
            warn=warn,
        )
    if given.text is not None:
        raise ProbeError(f"`text` is for language models; {first.name} reads images")
    sequences = given.sequences
    config = first.config
    size, patch = config.image_size, config.patch_size
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(sequences, config.num_channels, size, size, generator=generator)
    n_tokens = (size // patch) ** 2 + 1  # the patches and [CLS]
    mask = torch.ones(sequences, n_tokens, dtype=torch.long)
    return Encoded(
        pixels.to(first.dtype), mask, "seeded noise pixels", f"N(0, 1) pixels, seed {seed}", ""
    )
