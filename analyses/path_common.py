"""What the path analyses that run a model share: their batches and provenance.

Their request, checks and inputs are every analysis's (:func:`analyses.preamble.begin`),
with seeded noise images for a vision model.
"""

from __future__ import annotations

from probe.loading import ProbedModel
from probe.requests.inputs import Encoded
from probe.requests.request import provenance


def my_batches(inputs: Encoded, batch_size: int, part: tuple[int, int]) -> list:
    """The batches one part ``(rank, world_size)`` of a data-parallel run takes: a contiguous
    run of whole batches (:func:`probe.distributed.shard`), each one the single-process run
    makes, with the global sequence numbers."""
    from probe.distributed import shard

    batches = inputs.batches(batch_size)
    return batches[slice(*shard(len(batches), *part))]


def model_attrs(models: list[ProbedModel], encoded: Encoded) -> dict:
    """The provenance attributes of a path result (:func:`probe.requests.request.provenance`)."""
    return provenance(models, encoded) | {"world_size": 1}  # torchrun sets its own
