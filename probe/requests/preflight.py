"""What a run is refused for before any model loads: every model of a command is checked
first, so that nothing runs (and nothing is written) when a later one would fail.

For each model: what [`probe.loading.preflight`][probe.loading.preflight] refuses (where
it is, its revision, its config with its overrides, its family, its size against the
device), for each init the run loads; then what the run asks of it: pretrained weights in
a local folder, the kind of input it reads, at most as many tokens as it takes, a branch
scale its family runs.  Configs only: no weight is read.
"""

from __future__ import annotations

from pathlib import Path

from probe.errors import ProbeError, one_line
from probe.requests.inputs import check_input_kind


def check_models(
    requests, inputs, *, tokens=None, branch_scale=None, tokenize=False, variants=(), mask=None
) -> None:
    """Check every [`probe.Model`][probe.requests.request.Model] of `requests` against `inputs`
    (a [`probe.Inputs`][probe.requests.request.Inputs]) before the first runs.

    Parameters
    ----------
    requests
        The models, in the order they would run.
    inputs
        What they would read.
    tokens
        The run's tokens per sequence; None: `inputs.tokens`.
    branch_scale
        The run's `branch_scale` (a number or an expression in L), or None.
    variants
        The variants the run measures (names): those that take no branch scale are refused
        with one.
    mask
        The run's attention mask (`probe.surgery.masks`), or None: one the model's
        attention cannot take is refused.
    tokenize
        Also read the model's tokenizer and cut its text as the run will (a text too short,
        ids past a vocabulary its config shrank): a sweep's points, whose configs and
        token counts differ from the model's.

    Raises
    ------
    ProbeError
        One line naming the first model that would fail.
    """
    tokens = inputs.tokens if tokens is None else tokens
    for request in requests:
        if not isinstance(request.source, str | Path):
            continue  # a module the caller holds: checked as it runs
        name = str(request.source)
        try:
            _check_model(request, name, inputs, tokens, branch_scale, tokenize, variants, mask)
        except ProbeError as err:
            text = str(err)
            raise ProbeError(text if name in text else f"{name}: {text}") from None


def _check_model(request, name: str, inputs, tokens, branch_scale, tokenize, variants, mask):
    """One model of :func:`check_models`."""
    from types import SimpleNamespace

    from probe.loading import preflight
    from probe.surgery import masks

    for init in request.init:  # each init reads the config its load reads
        location, _, config, adapter = preflight(
            name, init, config=request.config, revision=request.revision,
            device=request.device, dtype=request.dtype,
        )  # fmt: skip
        if init == "pretrained" and isinstance(location, Path):
            if not [*location.glob("*.safetensors"), *location.glob("*.bin")]:
                raise ProbeError(
                    f"cannot load pretrained weights from folder {location} (it holds no "
                    "*.safetensors or *.bin file); use `init` random or a complete "
                    "save_pretrained folder"
                )
            check_weight_files(location, config, adapter)
        probed = SimpleNamespace(name=name, adapter=adapter, config=config)
        check_input_kind(probed, inputs.text, inputs.images)
        if tokens is not None:
            check_tokens(probed, tokens)
        if branch_scale is not None:
            _check_branch_scale(probed, adapter, config, branch_scale, variants)
        if mask is not None:  # from the config: no load
            masks.check(probed, masks.parse_mask(mask))
        if tokenize and adapter.inputs != "pixels" and inputs.ids is None:
            _check_text(location, request.revision, config, inputs, tokens)


def check_weight_files(location: Path, config, adapter) -> None:
    """A folder's safetensors files read as far as their headers: each file whole, and each
    tensor the model has in the shape ``config`` gives it (built on the meta device: no
    memory).  A truncated file or a config that does not belong to the weights fails here,
    before any run, as the load itself would fail later.  ``*.bin`` files are left to the
    load: their shapes are known only by unpickling them."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(location.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as weights:
                for key in weights.keys():  # safe_open gives keys(), not iteration
                    shapes[key] = tuple(weights.get_slice(key).get_shape())
        except (SafetensorError, OSError) as err:
            raise ProbeError(
                f"cannot load pretrained weights from folder {location} ({path.name}: "
                f"{one_line(err)}); use `init` random or a complete save_pretrained folder"
            ) from None
    if not shapes:
        return
    expected, prefix = _meta_shapes(config, adapter)
    for key, shape in shapes.items():
        for name in (key, key.removeprefix(prefix + "."), f"{prefix}.{key}"):
            if name in expected and expected[name] != shape:
                raise ProbeError(
                    f"folder {location}: weight {key} has shape {list(shape)} where its config "
                    f"gives {list(expected[name])}; the config and the weights do not belong "
                    "together"
                )


def _meta_shapes(config, adapter) -> tuple[dict[str, tuple[int, ...]], str]:
    """The model's tensor shapes for ``config`` (built on the meta device) and its
    ``base_model_prefix``, the name a checkpoint with a head puts before the base model's."""
    import torch

    from probe.loading import model_class
    from probe.loading.quiet import quiet

    cls = model_class(adapter)
    with quiet(), torch.device("meta"):
        model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]
    return {k: tuple(v.shape) for k, v in named}, getattr(model, "base_model_prefix", "")


def _check_text(location, revision, config, inputs, tokens) -> None:
    """The model's text inputs made as the run makes them, where it has a tokenizer."""
    from probe.loading.tokenizers import tokenizer_at
    from probe.requests.inputs import make_inputs

    tokenizer = tokenizer_at(location, revision)
    if tokenizer is not None:
        make_inputs(tokenizer, config.vocab_size, text=inputs.text, sequences=inputs.sequences,
                    tokens=tokens if tokens is not None else inputs.tokens)  # fmt: skip


def check_tokens(probed, tokens: int) -> None:
    """A model that reads token ids takes at most its position table's length of them.

    Parameters
    ----------
    probed
        A [`ProbedModel`][probe.loading.ProbedModel], or anything with its `name`,
        `adapter` and `config`.
    tokens
        Tokens per sequence the run asks for.

    Raises
    ------
    ProbeError
        One line with the model's limit.
    """
    limit = probed.adapter.max_tokens(probed.config)
    if probed.adapter.inputs == "ids" and limit is not None and tokens > limit:
        raise ProbeError(
            f"{probed.name} takes at most {limit} tokens per sequence; use `tokens` {limit} or fewer"
        )


def _check_branch_scale(probed, adapter, config, branch_scale, variants=()) -> None:
    """A branch scale other than 1 runs as walker steps: a family without them refuses it,
    and so does a variant that takes none (``variants``: names, as `collapse` takes them)."""
    from dataclasses import replace

    from probe.surgery.ablate import PRESETS, Ablation, parse_variants
    from probe.surgery.scaling import parse_branch_scale
    from probe.surgery.trace import check_norm_variant

    scale = parse_branch_scale(branch_scale)
    alpha = 1.0 if scale.is_one else scale.value(adapter.n_layers(config))
    if alpha != 1:
        check_norm_variant(probed, Ablation(branch_scale=alpha))
        chosen = parse_variants(variants) if isinstance(variants, str) else variants
        for name in chosen:  # the LayerNorm variants take no branch scale
            if name in PRESETS:
                replace(PRESETS[name], branch_scale=alpha)
