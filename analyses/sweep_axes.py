"""The axes of a sweep that cannot change what runs, and checkpoints that are not one run.

A swept setting is a dimension of the result, so each of its values must give a run of its
own: two values that give the same run would draw one point twice under two names.
[`check`][probe.analyses.sweep_axes.check] refuses such an axis in one line once every
point's request has passed its checks ([`sweep.plan`][probe.analyses.sweep.plan] calls it).
It reads configs (`probe.loading.preflight`, what the points' checks read), for `seeds` at
pretrained weights the tokenizers, and the bytes of a series' weight files; no model is built.

* `seeds`: a seed draws the random init and the synthetic inputs (token ids where the model
  has no tokenizer, noise where no `images` are given), nothing else.  With `init`
  pretrained only and inputs read from a text through the model's tokenizer or from
  `images`, no value reaches the run.  Whether a checkpoint has a usable tokenizer is known
  only by loading it, so it is loaded here as the run loads it
  (`probe.loading.tokenizers.tokenizer_at`).  With `allow_missing_weights` the tensors a
  checkpoint lacks are drawn from the seed, so the seeds do change the run.
* `tokens`: an image model reads each image as its patches and [CLS] token, as many
  whatever `tokens` says.
* `branch_scale`: two scales of equal value at every depth the grid runs (`1` and `1.0`,
  `1/L` and `L^-1`) scale every branch alike; alpha is taken as `probe.surgery.scaling` evaluates
  it, and 1 and its spellings run the model as it is.
* `mask`: `causal` on a causal model and `bidirectional` on an encoder, without a sliding
  window, are its own mask (`model`);
  `window:W` with W at least the tokens less one is `bidirectional`, and `causal-window:W`
  so wide is `causal`.
* `config`: two values a field reads alike (`1` and `1.0` of a real-number field) build
  one config; dropout fields (a name holding ``dropout`` or ending in ``pdrop``) and
  ``use_cache`` enter no forward pass in eval mode, which is how every model runs.
* `revisions`: two revisions that resolve to one commit are one checkpoint; at `init`
  random only a revision gives nothing but its config, so two with the same config draw the
  same weights.  (A revision of a local folder or of probe's own checkpoints is refused
  with the points' checks: they have none.)
* `steps`: at `init` random only a step gives nothing but its config, which is the same at
  every step of one training run.

A checkpoint series (`steps`, or a shipped one such as ``gpt2-tiny-steps``) must be one
training run: every step's folder holds the same family and config, apart from what a save
writes about itself (:data:`SAVE_FIELDS` and transformers' private fields), and weights of
its own: two steps whose weight files (``*.safetensors``, ``*.bin``) are the same byte for
byte are refused, naming both.  Files are compared by sampled blocks first and byte for
byte where those agree, so a refusal is never a guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from probe.errors import ProbeError
from probe.loading.identity import file_digest
from probe.surgery.masks import parse_mask

from . import sweep_points
from .sweep_points import Axis, Point, parse_counts, parse_words

#: What a save writes about itself rather than the model: the steps of one run may differ there.
SAVE_FIELDS = ("_name_or_path", "transformers_version", "dtype", "torch_dtype")
#: Config fields besides dropout that no forward pass reads in eval mode.
INERT_FIELDS = ("use_cache",)
#: The files that hold a checkpoint's weights (as the points' checks look for them).
WEIGHT_SUFFIXES = (".safetensors", ".bin")

Requests = Callable[..., tuple]
"""``(sweep, point) -> (model, inputs, options)``: a point's request."""


def check(sweep, request_of: Requests) -> None:
    """Refuse an axis of `sweep` whose values cannot change the run, or checkpoints that are
    not one training run (module docstring).

    Parameters
    ----------
    sweep
        A [`Sweep`][probe.analyses.sweep.Sweep] whose points' requests have passed their checks.
    request_of
        A point's request, `(sweep, point) -> (model, inputs, options)`
        ([`point_request`][probe.analyses.sweep.point_request]).

    Raises
    ------
    ProbeError
        One line naming the axis, why its values give one run, and what to do.
    """
    for axis in sweep.axes:
        if axis.kind == "step" and len(axis.values) > 1:
            one_training_run(axis)
    read = _Configs()
    for axis in sweep.axes:
        if len(axis.values) < 2:
            continue
        if axis.kind == "seed":
            _seeds(sweep, request_of, read)
        elif axis.kind == "tokens":
            _tokens(sweep, request_of, read)
        elif axis.kind == "branch_scale":
            _branch_scales(axis, sweep, request_of, read)
        elif axis.kind == "mask":
            _masks(axis, sweep, request_of, read)
        elif axis.kind == "config":
            _config(axis, sweep, request_of, read)
        elif axis.kind == "revision":
            _revisions(axis, sweep, request_of, read)
        elif axis.kind == "step" and sweep.model.init == ("random",):
            raise ProbeError(
                "`steps` cannot change the run at `init` random: a step gives only its "
                "config, the same at every step of one training run, and the weights come "
                "from the seed; add `init` pretrained"
            )


class _Configs:
    """Each request's config and family as a load reads them, read once per request."""

    def __init__(self) -> None:
        self.found: dict = {}

    def __call__(self, model, init: str) -> tuple:
        """``(location, where, config, adapter)`` of `probe.loading.preflight`."""
        from probe.loading import preflight

        key = (str(model.source), init, model.config, model.revision)
        if key not in self.found:
            self.found[key] = preflight(
                model.source, init, config=model.config, revision=model.revision,
                device=model.device, dtype=model.dtype,
            )  # fmt: skip
        return self.found[key]


def _models(sweep, request_of: Requests) -> list[tuple]:
    """The distinct (model, inputs) of the sweep's points."""
    found = {}
    for point in sweep.points:
        model, inputs, _ = request_of(sweep, point)
        found.setdefault((repr(model), repr(inputs)), (model, inputs))
    return list(found.values())


def _line(sweep, axis: Axis) -> list[Point]:
    """The points along ``axis``, every other axis at its first value: one per value."""
    index = sweep.axes.index(axis)
    firsts = [a.values[0] for a in sweep.axes]
    return [Point(sweep.axes, (*firsts[:index], v, *firsts[index + 1 :])) for v in axis.values]


def _twice(values: Iterable, keys: Iterable) -> tuple | None:
    """The first two values whose keys are equal, or None."""
    seen: dict = {}
    for value, key in zip(values, keys, strict=True):
        if key in seen:
            return seen[key], value
        seen[key] = value
    return None


def _fields(config) -> dict:
    """A config's fields that say what the model is (what a save says of itself left out)."""
    return {
        k: v for k, v in config.to_dict().items() if k not in SAVE_FIELDS and not k.startswith("_")
    }


def _key(config) -> str:
    return json.dumps(_fields(config), sort_keys=True, default=str)


def _seeds(sweep, request_of: Requests, read: _Configs) -> None:
    """Refuse `seeds` where no point draws anything from its seed."""
    from probe.loading.tokenizers import tokenizer_at

    if "random" in sweep.model.init or sweep.model.allow_missing_weights:
        return
    read_from = set()
    for model, inputs in _models(sweep, request_of):
        location, _, _, adapter = read(model, "pretrained")
        if adapter.inputs == "pixels":
            if inputs.images is None:  # noise images, drawn from the seed
                return
            read_from.add("the images of `images`")
        elif tokenizer_at(location, model.revision) is None:  # synthetic ids
            return
        else:
            read_from.add("a text read through the model's tokenizer")
    raise ProbeError(
        "`seeds` cannot change the run: at `init` pretrained the weights are the "
        f"checkpoint's and the inputs are {' and '.join(sorted(read_from))}, so nothing is "
        "drawn from a seed; sweep `seeds` with `init` random or both, or give one seed"
    )


def _tokens(sweep, request_of: Requests, read: _Configs) -> None:
    """Refuse `tokens` where every point's model reads images."""
    from probe.requests.inputs import image_tokens

    for model, _ in _models(sweep, request_of):
        _, _, config, adapter = read(model, model.init[0])
        if adapter.inputs != "pixels":
            return
    raise ProbeError(
        f"`tokens` cannot change the run: {sweep.model.name} reads images, each as its "
        f"{image_tokens(config) - 1} patches and [CLS] token whatever `tokens` says; "
        "drop `tokens`"
    )


def _branch_scales(axis: Axis, sweep, request_of: Requests, read: _Configs) -> None:
    """Refuse two scales of the same value at every depth the grid runs."""
    from probe.surgery.scaling import parse_branch_scale

    depths = set()
    for model, _ in _models(sweep, request_of):
        for init in model.init:
            _, _, config, adapter = read(model, init)
            depths.add(adapter.n_layers(config))
    depths = sorted(depths)
    scales = [parse_branch_scale(value) for value in axis.values]
    alphas = [tuple(1.0 if s.is_one else s.value(depth) for depth in depths) for s in scales]
    same = _twice(axis.values, alphas)
    if same is not None:
        at = ", ".join(f"L={depth}" for depth in depths[:4]) + (", ..." if len(depths) > 4 else "")
        raise ProbeError(
            f"`branch_scale` {same[0]} and {same[1]} are the same scale at every depth the "
            f"sweep runs ({at}): the same run twice; keep one of them"
        )


def _masks(axis: Axis, sweep, request_of: Requests, read: _Configs) -> None:
    """Refuse two masks that are one run on every model and token count of the grid:
    `causal` and `model` on a causal model, a window as wide as the sequence and the mask
    without a window."""
    from types import SimpleNamespace

    from probe.requests.inputs import image_tokens
    from probe.surgery.masks import parse_mask, same_run

    runs = []
    for value in axis.values:
        mask, ran = parse_mask(value), []
        for model, inputs in _models(sweep, request_of):
            for init in model.init:
                _, _, config, adapter = read(model, init)
                probed = SimpleNamespace(config=config, adapter=adapter)
                # An image's token count is its patches' and [CLS], whatever `tokens` says.
                pixels = adapter.inputs == "pixels"
                tokens = image_tokens(config) if pixels else inputs.tokens
                ran.append(same_run(probed, mask, tokens))
        runs.append(tuple(ran))
    same = _twice(axis.values, runs)
    if same is not None:
        raise ProbeError(
            f"`mask` {same[0]} and {same[1]} are the same mask on every model and sequence "
            "length the sweep runs: the same run twice; keep one of them"
        )


def _config(axis: Axis, sweep, request_of: Requests, read: _Configs) -> None:
    """Refuse a field no forward pass reads, or two values the field reads alike."""
    name = axis.name
    if "dropout" in name.lower() or name.lower().endswith("pdrop") or name in INERT_FIELDS:
        what = (
            "a cache of past keys and values, which changes no number the run measures"
            if name in INERT_FIELDS
            else "dropout, which is off in eval mode, where probe runs every model"
        )
        raise ProbeError(
            f"the config field {name} cannot change the run: it is {what}; drop it from `config`"
        )
    configs = []
    for point in _line(sweep, axis):
        model, _, _ = request_of(sweep, point)
        configs.append(read(model, "random")[2])
    same = _twice(axis.values, [_key(config) for config in configs])
    if same is not None:
        value = getattr(configs[axis.values.index(same[0])], name, None)
        raise ProbeError(
            f"the config field {name} reads {same[0]} and {same[1]} as one value, "
            f"{json.dumps(value, default=str)}: the same run twice; keep one of them in `config`"
        )


def _revisions(axis: Axis, sweep, request_of: Requests, read: _Configs) -> None:
    """Refuse two revisions of one commit, or, at random init only, of one config."""
    models = [request_of(sweep, point)[0] for point in _line(sweep, axis)]
    name = sweep.model.name
    if "pretrained" in sweep.model.init:
        commits = [_commit(m, read(m, "pretrained")[0]) for m in models]
        keys = [
            commit or f"revision {value}"
            for commit, value in zip(commits, axis.values, strict=True)
        ]
        same = _twice(axis.values, keys)
        if same is not None:
            commit = commits[axis.values.index(same[0])]
            raise ProbeError(
                f"`revisions` {same[0]} and {same[1]} are one commit of {name} "
                f"({str(commit)[:12]}): the same run twice; keep one of them"
            )
        return
    same = _twice(axis.values, [_key(read(m, "random")[2]) for m in models])
    if same is not None:
        raise ProbeError(
            f"`revisions` {same[0]} and {same[1]} hold the same config of {name}, and at "
            "`init` random a revision gives only its config (the weights come from the "
            "seed): the same run twice; add `init` pretrained, or keep one of them"
        )


def _commit(model, location) -> str | None:
    """The commit a hub revision resolved to: the snapshot its config was read from (the
    config was just read, so it is in the local cache); None where that cannot be told."""
    if not isinstance(location, str):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(location, "config.json", revision=model.revision)
    return Path(found).parent.name if isinstance(found, str) else None


# --- checkpoint series ---------------------------------------------------------------------


def one_training_run(axis: Axis) -> None:
    """The step folders of ``axis`` are one training run: one family, one config, and weights
    of their own at every step.

    Parameters
    ----------
    axis
        A `step` axis: its steps and their folders.

    Raises
    ------
    ProbeError
        A step of another family or config than the first, naming the fields, or two steps
        whose weight files are the same, naming both.
    """
    from probe.loading import read_config

    first = None
    for step, folder in zip(axis.values, axis.folders, strict=True):
        config, _ = read_config(str(folder), prefer_bundled=False)
        fields = _fields(config)
        if first is None:
            first = (step, folder, config.model_type, fields)
            continue
        step0, folder0, family0, fields0 = first
        if config.model_type != family0:
            raise ProbeError(
                f"`steps` are not one training run: step {step} ({folder}) is a "
                f"{config.model_type} checkpoint and step {step0} ({folder0}) a {family0} one; "
                "give the checkpoints one training run wrote"
            )
        differ = [k for k in sorted({*fields, *fields0}) if fields.get(k) != fields0.get(k)]
        if differ:
            shown = differ[:3]
            more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
            raise ProbeError(
                f"`steps` are not one training run: step {step} ({folder}) has "
                f"{_settings(fields, shown)} where step {step0} ({folder0}) has "
                f"{_settings(fields0, shown)}{more}; give the checkpoints one training run wrote"
            )
    _distinct_weights(axis)


def _settings(fields: dict, names: list[str]) -> str:
    return ", ".join(f"{k}={json.dumps(fields.get(k), default=str)}" for k in names)


def _distinct_weights(axis: Axis) -> None:
    """Refuse two steps whose weight files are the same byte for byte (the same names, and
    the sha256 of every byte of each)."""
    seen: dict = {}
    for step, folder in zip(axis.values, axis.folders, strict=True):
        files = sorted(
            p for p in Path(folder).iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()
        )
        if not files:  # a folder without weights: the points' checks say what it lacks
            continue
        key = tuple((p.name, file_digest(p)) for p in files)
        if key in seen:
            other, other_folder = seen[key]
            raise ProbeError(
                f"`steps` {other} and {step} hold the same weights ({other_folder} and "
                f"{folder}): the same run twice; drop one of them, or give the folder each "
                "step wrote"
            )
        seen[key] = (step, folder)


@dataclass(frozen=True)
class Grid:
    """What a sweep varies, as given.

    ``config``: {field: values} swept at random init (``{"n_layer": [2, 4, 8]}``);
    ``branch_scale``: scales of the residual branches (numbers or texts in L such as
    ``"1/sqrt(L)"``); ``mask``: attention masks (``probe.surgery.masks``: ``causal``,
    ``window:2``, ...); ``revisions``: hub revisions; ``steps``: (training step, folder) of
    local checkpoints; ``tokens`` and ``seeds``: numbers or texts like ``"0-4"``.  A
    setting given one value is fixed, not swept.
    """

    config: dict | None = None
    branch_scale: object = None
    mask: object = None
    revisions: object = None
    steps: Sequence[tuple[int, str]] | None = None
    tokens: object = None
    seeds: object = None

    @classmethod
    def take(cls, settings: dict) -> Grid:
        """The grid's settings, taken out of ``settings`` (what is left is the request's)."""
        return cls(**{f.name: settings.pop(f.name) for f in fields(cls) if f.name in settings})

    def axes(self) -> tuple[list[Axis], dict]:
        """The axes of the values given (two or more each) and the fixed settings (one each)."""
        given: list[tuple[str, str, tuple]] = []
        if self.config is not None:
            given += [(k, "config", v) for k, v in sweep_points.parse_config(self.config)]
        scale = self.branch_scale
        if scale is not None:
            words = parse_words(scale, "branch_scale") if isinstance(scale, str) else (
                sweep_points.listed(scale, "branch_scale"))  # fmt: skip
            given.append(("branch_scale", "branch_scale", words))
        if self.mask is not None:
            words = tuple(parse_mask(w).text for w in parse_words(self.mask, "mask"))
            given.append(("mask", "mask", words))  # the axis refuses one given twice
        if self.revisions is not None:
            given.append(("revision", "revision", parse_words(self.revisions, "revisions")))
        if self.tokens is not None:
            given.append(("tokens", "tokens", parse_counts(self.tokens, "tokens", 2, 2**31 - 1)))
        if self.seeds is not None:
            given.append(("seed", "seed", parse_counts(self.seeds, "seeds", 0, 2**63 - 1)))
        axes, fixed = [], {}
        for name, kind, values in given:
            if len(values) > 1:
                axes.append(Axis(name, kind, values))
            else:
                fixed[(name, kind)] = values[0]
        if self.steps is not None:
            axis = Axis("step", "step", *sweep_points.parse_steps(self.steps))
            axes.insert(
                len([a for a in axes if a.kind in ("config", "branch_scale", "mask")]), axis
            )
        if len([a for a in axes if a.kind in ("revision", "step")]) > 1:
            raise ProbeError("give either `revisions` or `steps`, not both")
        return axes, fixed
