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

from .errors import ProbeError
from .inputs import check_input_kind


def check_models(requests, inputs, *, tokens=None, branch_scale=None) -> None:
    """Check every [`probe.Model`][probe.request.Model] of `requests` against `inputs`
    (a [`probe.Inputs`][probe.request.Inputs]) before the first runs.

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
            _check_model(request, name, inputs, tokens, branch_scale)
        except ProbeError as err:
            text = str(err)
            raise ProbeError(text if name in text else f"{name}: {text}") from None


def _check_model(request, name: str, inputs, tokens, branch_scale) -> None:
    """One model of :func:`check_models`."""
    from types import SimpleNamespace

    from .loading import preflight

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
        probed = SimpleNamespace(name=name, adapter=adapter, config=config)
        check_input_kind(probed, inputs.text, inputs.images)
        if tokens is not None:
            check_tokens(probed, tokens)
        if branch_scale is not None:
            _check_branch_scale(probed, adapter, config, branch_scale)


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


def _check_branch_scale(probed, adapter, config, branch_scale) -> None:
    """A branch scale other than 1 runs as walker steps: a family without them refuses it."""
    from .ablate import Ablation
    from .scaling import parse_branch_scale
    from .trace import check_norm_variant

    scale = parse_branch_scale(branch_scale)
    alpha = 1.0 if scale.is_one else scale.value(adapter.n_layers(config))
    if alpha != 1:
        check_norm_variant(probed, Ablation(branch_scale=alpha))
