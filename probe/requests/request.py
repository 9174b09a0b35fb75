"""One request: the model to run (:class:`Model`) and what it reads (:class:`Inputs`).

Every model-based analysis -- ``collapse``, ``paths`` sample and decompose, ``check`` --
takes these two values and only its own options beside them::

    >>> from probe import Model, Inputs
    >>> from probe.analyses import collapse
    >>> ds = collapse.run(Model("minilm", init="pretrained"), Inputs(sequences=8, tokens=64))

Both are frozen and checked once, when they are built: a value outside its domain raises
:class:`~probe.errors.ProbeError` with one line that names the parameter (written
```name``` there; the command line shows the option it declares for it).  What can only be
checked against a loaded model (its token limit, whether it reads text or images, memory)
is checked by the analysis, before any forward pass.

:func:`provenance` derives the attributes every result carries about how it was made from
the loaded models and the inputs they read, and :func:`record` the request as a result keeps
it, as data (``probe.reports.reproduce`` renders the command line that asks for it).

Nothing here imports torch at module level: the command line builds a request before it
loads anything heavy.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from probe.errors import ProbeError
from probe.names import DTYPES, INITS
from probe.requests import checks
from probe.requests.overrides import freeze

#: Strategies accelerate spreads a model with (``device_map``), besides an explicit map.
DEVICE_MAPS = ("auto", "balanced", "sequential")


def parse_inits(init: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``"both"``, one init, or a sequence -> inits in the order of probe.names.INITS."""
    wanted = list(INITS) if init == "both" else [init] if isinstance(init, str) else list(init)
    unknown = [name for name in wanted if name not in INITS]
    if unknown or not wanted:
        raise ProbeError(
            f"unknown init {', '.join(map(str, unknown)) or init!r}; "
            "choose pretrained, random or both"
        )
    return tuple(name for name in INITS if name in wanted)


def dtype_name(dtype) -> str | None:
    """A dtype as probe names it (``float32``, ...): from a name, a ``torch.dtype`` or None."""
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ProbeError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return name


#: Longest revision accepted (a branch, a tag or a 40-digit commit is far shorter).
MAX_REVISION = 200


def check_revision(revision) -> str:
    """A hub revision: a non-empty text without spaces or NUL characters."""
    if not isinstance(revision, str):
        raise ProbeError(f"`revision` is a text (a branch, tag or commit), got {revision!r}")
    if (
        not revision.strip()
        or len(revision) > MAX_REVISION
        or any(c.isspace() or c == "\0" for c in revision)
    ):
        raise ProbeError(
            f"`revision` {checks.shown(revision[:MAX_REVISION])} is not a branch, tag or commit "
            "name (empty, too long, or with spaces)"
        )
    return revision


def _is_module(source) -> bool:
    """A model object the caller holds (an ``nn.Module`` or a ProbedModel), not a name."""
    return not isinstance(source, str | os.PathLike)


@dataclass(frozen=True)
class Model:
    """What to load, how and where.

    Frozen and checked once, when it is built; the checked values replace the given ones.  A
    module the caller holds is never modified.

    Parameters
    ----------
    source
        A hub id, a local `save_pretrained` folder, a bundled name (`minilm`, `gpt2`, ...), an
        `nn.Module` of a supported family, or a loaded
        [`ProbedModel`][probe.loading.ProbedModel].
    init
        `pretrained`, `random` or `both` (a sequence of them is accepted too); kept as the tuple
        of inits in probe's order.  A module is run once, under its own weights (`both` means
        `pretrained`).
    seed
        Fixes the random init and the synthetic inputs.
    dtype
        `float32`, `float64`, `bfloat16`, `float16`, or None for the analysis' default.
    device
        `cpu`, `cuda`, `cuda:N`, or None.
    device_map
        `auto`, `balanced`, `sequential` or an explicit `{module: device}` map: accelerate
        spreads the model over the GPUs, the CPU and the disk.
    max_memory
        `{device: bytes or "2GiB"}`: caps each device of a `device_map`.
    offload_folder
        Holds what a `device_map` puts on disk.
    remote
        `True` runs on NDIF through nnsight's remote backend, `"local"` nnsight's local
        simulation of it.
    allow_missing_weights
        Probe a checkpoint that lacks tensors: they stay at random init and the result says so.
    config
        Config fields to change before the model is built (`{"n_layer": 4}`; the command line's
        set option), at random init only: an override changes the architecture.  Kept as a
        frozen `probe.requests.overrides.ConfigOverrides` (None for none); each key and value is checked
        against the family's config when it is read.
    revision
        A hub id's revision (a branch, tag or commit: Pythia's `step1000`), read through
        `from_pretrained(revision=...)`; offline it must be in the local cache.

    Raises
    ------
    ProbeError
        A value outside its domain, or settings that do not go together: an empty `source`,
        or one that is neither a name, a folder, a module with a `.config` nor a `ProbedModel`;
        `device` with `device_map`; `max_memory` or `offload_folder` without `device_map`;
        `remote` with random init, a device, a module or a `revision`; `config` with pretrained
        weights or a module; `revision` with a module.
    """

    source: Any
    init: str | tuple[str, ...] = "both"
    seed: int = 0
    dtype: str | None = None
    device: str | None = None
    device_map: str | dict | None = None
    max_memory: dict | None = None
    offload_folder: str | os.PathLike | None = None
    remote: bool | str = False
    allow_missing_weights: bool = False
    config: Mapping[str, Any] | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        source = self.source
        if isinstance(source, str | os.PathLike):
            if not str(source).strip():
                raise ProbeError("`source` is empty; give a hub id, a local folder or a name")
        elif not hasattr(source, "config") and not hasattr(source, "adapter"):
            raise ProbeError(
                "`source` must be a model name, a folder, an nn.Module with a .config or a "
                f"ProbedModel; got {type(source).__name__}"
            )
        set_ = object.__setattr__  # frozen: the checked values replace the given ones
        set_(self, "init", parse_inits(self.init))
        set_(self, "seed", checks.integer("`seed`", self.seed, 0, checks.MAX_SEED))
        set_(self, "dtype", dtype_name(self.dtype))
        if self.device is not None:
            set_(self, "device", checks.device(self.device, "`device`"))
        dm = self.device_map
        if dm is not None and not isinstance(dm, dict) and dm not in DEVICE_MAPS:
            raise ProbeError(f"unknown device map {dm!r}; choose {', '.join(DEVICE_MAPS)}")
        if dm is not None and self.device not in (None, "cpu"):
            raise ProbeError("use either `device` or `device_map`, not both")
        if dm is None and (self.max_memory is not None or self.offload_folder is not None):
            raise ProbeError("`max_memory` and `offload_folder` go with `device_map`")
        if self.remote not in (False, True, "local"):
            raise ProbeError(f"`remote` is True, False or 'local', got {self.remote!r}")
        if self.remote and self.init != ("pretrained",):
            raise ProbeError("`remote` runs pretrained weights only; add `init` pretrained")
        if self.remote and (dm is not None or self.device not in (None, "cpu")):
            raise ProbeError(
                "`remote` runs on the service's devices; drop `device` and `device_map`"
            )
        if self.remote and _is_module(source):
            raise ProbeError("`remote` runs a model by its name; pass the name, not a module")
        set_(self, "config", freeze(self.config))
        if self.config is not None and _is_module(source):
            raise ProbeError("`config` builds a model from its name; a module is built already")
        if self.config is not None and "pretrained" in self.init:
            raise ProbeError(
                "`config` changes the architecture, so it runs at random init only; "
                "use `init` random"
            )
        if self.revision is not None:
            set_(self, "revision", check_revision(self.revision))
            if _is_module(source):
                raise ProbeError(
                    "`revision` names hub files; a module passed by the caller has none"
                )
            if self.remote:
                raise ProbeError("`remote` runs the hosted revision; drop `revision`")

    @property
    def name(self) -> str:
        """The model as results name it: the name or folder as given, or the module's name."""
        if not _is_module(self.source):
            return str(self.source)
        return getattr(self.source, "name", None) or type(self.source).__name__

    @property
    def placement(self) -> dict:
        """The keywords of [`probe.load`][probe.loading.load] that say where the weights go."""
        spread = {
            "device_map": self.device_map,
            "max_memory": self.max_memory,
            "offload_folder": self.offload_folder,
        }
        return spread | ({"remote": self.remote} if self.remote else {})

    def with_defaults(self, **defaults) -> Model:
        """This request with ``defaults`` filling the fields left at None (an analysis's)."""
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    def load(self, verify: bool = True) -> list:
        """Load the model: one [`ProbedModel`][probe.loading.ProbedModel] per init.

        Parameters
        ----------
        verify
            Run the family spec's self-test on a model loaded by name and refuse it where the test
            fails (see [`probe.load`][probe.loading.load]); a module is always checked.

        Returns
        -------
        list[ProbedModel]
            One model per init, pretrained first (if its weights cannot be had, nothing runs).  A
            `source` that is a `ProbedModel` is returned as it is, or converted to the `device`
            and `dtype` asked for; a module is wrapped once, under its own weights.

        Raises
        ------
        ProbeError
            A `ProbedModel` asked for another init, or to be moved or converted while a
            `device_map` spreads it; and whatever [`probe.load`][probe.loading.load] and
            [`probe.wrap`][probe.loading.wrap] refuse.
        """
        from probe.loading import ProbedModel, as_dtype, load, wrap

        source = self.source
        if isinstance(source, ProbedModel):
            if self.init != (source.init,):
                raise ProbeError(
                    f"this model is loaded with init {source.init!r}; pass init={source.init!r}"
                )
            if source.device_map and (
                self.device is not None
                or (self.dtype is not None and as_dtype(self.dtype) != source.dtype)
            ):
                raise ProbeError(
                    "this model is spread with a device_map and is not moved or converted; "
                    f"pass device=None and dtype={dtype_name(source.dtype)!r}, "
                    "or load it with the dtype you want"
                )
            if source.device_map or (self.dtype is None and self.device is None):
                return [source]
            converted = wrap(
                source.model,
                name=source.name,
                tokenizer=source.tokenizer,
                init=source.init,
                seed=source.seed,
                device=self.device,
                dtype=self.dtype,
            )
            converted.checkpoint = source.checkpoint  # the same checkpoint, converted
            return [converted]
        if _is_module(source):
            init = self.init[0]  # "both" is the module's own weights, as pretrained
            return [wrap(source, init=init, seed=self.seed, device=self.device, dtype=self.dtype)]
        return [
            load(
                source,
                init=init,
                seed=self.seed,
                device=self.device,
                dtype=self.dtype,
                allow_missing_weights=self.allow_missing_weights,
                verify=verify,
                config=self.config,
                revision=self.revision,
                **self.placement,
            )
            for init in self.init
        ]

    def as_fields(self, dtype: str | None = None) -> dict:
        """The model as a result records it (``dtype``: as resolved): its name, init and
        seed, then what differs from the defaults, as data (``probe.reports.reproduce``
        renders the command line that asks for it)."""
        found = {"source": self.name, "init": "both" if self.init == INITS else self.init[0]}
        found["seed"] = self.seed
        if (dtype or self.dtype) is not None:
            found["dtype"] = dtype or self.dtype
        if self.device not in (None, "cpu"):
            found["device"] = str(self.device)
        if isinstance(self.device_map, str):
            found["device_map"] = self.device_map
        if self.remote is True:
            found["remote"] = True
        if self.allow_missing_weights:
            found["allow_missing_weights"] = True
        if self.config is not None:
            found["config"] = list(self.config.settings())
        if self.revision is not None:
            found["revision"] = self.revision
        return found


@dataclass(frozen=True)
class Inputs:
    """What the model reads: a text, images, or token ids (pixel values) the caller holds.

    Frozen and checked once, when it is built (a text or image folder is read then).  Give at
    most one of `text`, `images` and `ids`; a size left at None takes the analysis' default.

    Parameters
    ----------
    text
        A UTF-8 text file, cut into sequences of exactly `tokens` real tokens.  None: the
        sample text shipped with probe (a model without a tokenizer reads seeded random ids).
    images
        A folder of images for an image model.  None: seeded noise images.
    ids
        A (sequence, token) tensor (or numpy array) of token ids, or an image model's
        (sequence, channel, height, width) pixels, used as they are; its shape gives
        `sequences` and `tokens`.
    sequences
        How many sequences; `"all"`: every full sequence of the text, every image of the folder.
    tokens
        Real tokens per sequence, at least 2.
    batch_size
        Sequences per forward pass.

    Raises
    ------
    ProbeError
        More than one of `text`, `images` and `ids`; `ids` of another shape, or with
        `sequences` or `tokens` that disagree with it; a size outside its domain;
        `sequences="all"` without `text` or `images`; a text or image folder that cannot be read.
    """

    text: str | os.PathLike | None = None
    images: str | os.PathLike | None = None
    ids: Any = field(default=None, compare=False)
    sequences: int | str | None = None
    tokens: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        given = [name for name in ("text", "images", "ids") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ProbeError(f"give one of `text`, `images` and `ids`, not {' and '.join(given)}")
        if self.ids is not None:
            from probe.requests.inputs import given_ids  # torch: not before it is needed

            ids, sequences, tokens = given_ids(self.ids, self.sequences, self.tokens)
            set_(self, "ids", ids)
            set_(self, "sequences", sequences)
            set_(self, "tokens", tokens)
        if self.sequences is not None and self.sequences != "all":
            set_(self, "sequences", checks.integer("`sequences`", self.sequences, 1))
        if self.sequences == "all" and self.text is None and self.images is None:
            raise ProbeError("`sequences` 'all' needs `text` or `images` to count them in")
        if self.tokens is not None:
            set_(self, "tokens", checks.integer("`tokens`", self.tokens, 2))
        if self.batch_size is not None:
            set_(self, "batch_size", checks.integer("`batch_size`", self.batch_size, 1))
        if self.text is not None:
            from probe.requests.inputs import read_text

            read_text(self.text)  # a bad text fails before any model is loaded
        if self.images is not None:
            from probe.requests.inputs import image_files

            image_files(self.images)  # and so does a bad image folder

    def with_defaults(self, **defaults) -> Inputs:
        """These inputs with ``defaults`` filling the sizes left at None (an analysis's).

        Not rebuilt with ``replace``: that would check the text again, which reads the whole
        file; the analysis' defaults are its own constants and need no check.
        """
        filled = copy.copy(self)
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(filled, name, value)
        return filled

    def as_fields(self, **resolved) -> dict:
        """The inputs as a result records them (``resolved``: sizes as run), as data."""
        found = {}
        if self.text is not None:
            found["text"] = str(self.text)
        if self.images is not None:
            found["images"] = str(self.images)
        for name in ("sequences", "tokens", "batch_size"):
            value = resolved.get(name, getattr(self, name))
            if value is not None:
                found[name] = value
        return found


def coerce(model, inputs: Inputs | None, flat: dict) -> tuple[Model, Inputs]:
    """The request of an analysis call: its two values, or the same built from keywords.

    ``flat`` holds the keywords of the flat form (``collapse.run("gpt2", tokens=64)``), the
    model's and the inputs' keywords side by side: its model keywords build a :class:`Model`, its input keywords
    :class:`Inputs`.  Mixing the two forms is refused.
    """
    model_keys = {f.name for f in fields(Model)} - {"source"}
    input_keys = {f.name for f in fields(Inputs)}
    unknown = set(flat) - model_keys - input_keys
    if unknown:
        raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
    as_model = {k: v for k, v in flat.items() if k in model_keys}
    as_inputs = {k: v for k, v in flat.items() if k in input_keys}
    if isinstance(model, Model):
        if as_model:
            raise ProbeError(f"give `{sorted(as_model)[0]}` in the Model, not beside it")
    else:
        model = Model(model, **as_model)
    if inputs is not None:
        if not isinstance(inputs, Inputs):
            raise ProbeError(f"`inputs` must be a probe.Inputs, got {type(inputs).__name__}")
        if as_inputs:
            raise ProbeError(f"give `{sorted(as_inputs)[0]}` in the Inputs, not beside it")
    else:
        inputs = Inputs(**as_inputs)
    return model, inputs


def checkpoint_of(models: list) -> dict:
    """What identifies the checkpoint the models were loaded from beyond its name
    (:mod:`probe.loading.identity`: a local folder's resolved path and fingerprint, the hub
    revision of pretrained weights); empty for probe's own checkpoints and bundled configs."""
    return {key: value for m in models for key, value in m.checkpoint.items()}


def provenance(models: list, encoded) -> dict:
    """The attributes every result carries about the models it measured and what they read.

    ``models``: the loaded ProbedModels (one per init); ``encoded``: the
    :class:`~probe.requests.inputs.Encoded` inputs they read.  Strings and numbers only.
    """
    from probe.measures.stats import precision_floor

    first = models[0]
    adapter, config = first.adapter, first.config
    return {
        "model": first.name,
        "family": first.family,
        "config": config.to_json_string(use_diff=True),
        "weights": "; ".join(f"{m.init}: {m.weights}" for m in models),
        "inputs": encoded.kind,
        "text_source": encoded.text_source,
        "text_sha256": encoded.text_sha256,
        "sequences": encoded.sequences,
        "tokens": encoded.tokens,
        "seed": first.seed,
        "dtype": dtype_name(first.dtype),
        # Below it a distance to rank one is the dtype's rounding (probe.measures.stats.FLOOR_FACTOR).
        "precision_floor": precision_floor(dtype_name(first.dtype)),
        "device": str(first.device),
        "n_layers": first.n_layers,
        "n_heads": adapter.n_heads(config),
        "hidden_size": adapter.hidden_size(config),
        **checkpoint_of(models),
    }


def record(analysis: str, model: Model, inputs: Inputs, options: dict, dtype=None, **sizes) -> str:
    """A request as a result records it (attribute ``request``, JSON): the analysis, its own
    ``options`` (those not at their defaults, as the library names them), the model's and
    the inputs' fields.  ``dtype`` and ``sizes`` (sequences, tokens, batch_size): the values
    as resolved by the run.  ``probe.reports.reproduce`` renders the command that asks for
    the same."""
    fields_ = {"analysis": analysis, "model": model.as_fields(dtype), "options": options}
    return json.dumps({**fields_, "inputs": inputs.as_fields(**sizes)}, default=str)
