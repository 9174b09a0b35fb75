"""What every model-based analysis does before its first forward pass, in one function.

:func:`begin` takes the request the way every analysis takes it (:func:`probe.requests.request.coerce`:
a :class:`probe.Model` and :class:`probe.Inputs`, or a model name and their keywords), fills
the analysis's default sizes, loads the models (``probe.loading``), runs the analysis's own
refusals on the first model, checks the tokens against the model's limit and the run
against memory, and makes the inputs.  Every refusal comes before any input is made, so a
command probing several models fails before it computes anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from probe.errors import ProbeError
from probe.loading import ProbedModel
from probe.requests import memory
from probe.requests.inputs import (
    Encoded,
    check_input_kind,
    image_files,
    image_tokens,
    model_inputs,
    read_text,
)
from probe.requests.preflight import check_tokens
from probe.requests.request import Inputs, Model, coerce

#: An analysis's own refusals, given the loaded models (one per init) and the inputs asked
#: for; it returns the bytes its run holds beyond the inputs and one batch's forward.
Check = Callable[[list[ProbedModel], Inputs], int]

#: Why an analysis that needs a number of sequences refuses "all".
ALL_IS_FOR_COLLAPSE = "`sequences` 'all' is for collapse; give a number of sequences"


@dataclass(frozen=True)
class Begun:
    """A checked request, its loaded models and the inputs they read."""

    request: Model
    given: Inputs
    models: list[ProbedModel]
    inputs: Encoded

    @property
    def first(self) -> ProbedModel:
        """The first init's model: the one every check reads."""
        return self.models[0]


def begin(
    model,
    inputs: Inputs | None,
    flat: dict,
    *,
    sizes: dict,
    check: Check | None = None,
    warn: Callable[[str], None] | None = None,
    dtype: str | None = None,
    every_sequence: bool = False,
    noise_images: bool = False,
) -> Begun:
    """The request checked and loaded, and its inputs made.

    Parameters
    ----------
    model, inputs, flat
        The analysis's request as the caller gave it (:func:`probe.requests.request.coerce`).
    sizes
        The analysis's default `sequences`, `tokens` and `batch_size`, where none were given.
    check
        The analysis's own refusals (a variant, a branch scale, a family it cannot run),
        called with the loaded models before the token limit; it returns the extra bytes
        its run holds, for the memory check.  None: none, and no extra bytes.
    warn
        Called with one line when the text or image folder holds fewer sequences than asked.
    dtype
        The analysis's default dtype where the request names none; None: the model's own.
    every_sequence
        Whether `sequences="all"` (every sequence the text or folder holds) is allowed.
    noise_images
        Whether a vision model reads seeded noise images (the path analyses) instead of the
        request's images, which are then refused.

    Raises
    ------
    ProbeError
        A request that cannot run, before any input is made.
    """
    request, given = coerce(model, inputs, flat)
    request = request.with_defaults(dtype=dtype)
    given = given.with_defaults(**sizes)
    if given.sequences == "all" and not every_sequence:
        raise ProbeError(ALL_IS_FOR_COLLAPSE)
    if noise_images and (given.images is not None or _pixels_passed(given)):
        raise ProbeError("the path analyses read seeded noise images; leave `images` out")
    models = request.load()
    first = models[0]
    extra = 0 if check is None else check(models, given)
    noise = noise_images and first.adapter.inputs == "pixels"
    if noise and given.text is not None:
        raise ProbeError(f"`text` is for language models; {first.name} reads images")
    check_input_kind(first, given.text, given.images)
    check_tokens(first, given.tokens)
    tokens = image_tokens(first.config) if first.adapter.inputs == "pixels" else given.tokens
    most = _most_sequences(given)
    memory.require_run(first, most, tokens, given.batch_size, extra)
    if noise:
        encoded = _noise_images(first, given, request.seed)
    else:
        encoded = model_inputs(first, given, seed=request.seed, warn=warn)
    return Begun(request, given, models, encoded)


def _pixels_passed(given: Inputs) -> bool:
    return given.ids is not None and given.ids.dim() == 4


def _most_sequences(given: Inputs) -> int:
    """The sequences the run reads at most: "all" is every image of the folder, or as many
    sequences as the text holds (one per `tokens` characters at most)."""
    if given.sequences != "all":
        return given.sequences
    if given.images is not None:
        return len(image_files(given.images))
    return len(read_text(given.text)[0]) // given.tokens + 1


def _noise_images(first: ProbedModel, given: Inputs, seed: int) -> Encoded:
    """Seeded standard-normal pixels at the config's image size, in the model's dtype; the
    token count is the config's (patches + 1), so `tokens` does not apply."""
    config = first.config
    size = config.image_size
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(given.sequences, config.num_channels, size, size, generator=generator)
    mask = torch.ones(given.sequences, image_tokens(config), dtype=torch.long)
    return Encoded(
        pixels.to(first.dtype), mask, "seeded noise pixels", f"N(0, 1) pixels, seed {seed}", ""
    )
