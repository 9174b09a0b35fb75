"""Config overrides applied to a family's config, each key and value checked in one line.

:func:`apply_overrides` changes the fields a request names (:class:`probe.requests.overrides.
ConfigOverrides`) on the config read for a model, before the model is built.  Each key must
be one of the family's own config fields (the generic fields every transformers config has,
``return_dict`` or ``dtype``, change how a model answers, not what it is, and are refused;
a misspelled key is told the closest ones); each value must have the field's type: a whole
number for an ``int`` field, a number for a ``float`` field (an integer is taken as a float),
``true``/``false`` for a ``bool``, text for a ``str``.  transformers' own validation of the
config runs next; what it or the model's constructor rejects (heads that do not divide the
width) is said by the loader with the settings named (:func:`point`).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from probe.loading.quiet import quiet
from probe.requests.overrides import ConfigOverrides, text_of

from ..errors import ProbeError, one_line


def point(name: str, overrides: ConfigOverrides) -> str:
    """How an error line names the model and its settings: ``gpt2 with n_head=5``."""
    return f"{name} with {overrides}"


def _base_fields() -> set[str]:
    from transformers import PretrainedConfig

    base = {f.name for f in dataclasses.fields(PretrainedConfig)}
    return base | set(PretrainedConfig().to_dict())


def family_fields(config) -> dict[str, Any]:
    """The family's own config fields -> their annotation (None where the config declares
    none: then the current value's type stands for it)."""
    base = _base_fields()
    found: dict[str, Any] = {}
    if dataclasses.is_dataclass(config):
        for f in dataclasses.fields(config):
            if f.name not in base and not f.name.startswith("_"):
                found[f.name] = _annotation(f.type)
    for key in config.to_dict():  # fields a config sets in its __init__ (probe's Fastformer)
        if key not in base and not key.startswith("_") and key not in found:
            found[key] = None
    return found


#: The scalar types a string annotation (``"int | None"``, from a module with postponed
#: annotations, probe's Fastformer config) may name.
_NAMED = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}


def _annotation(kind):
    """A field's type; a string of scalar names joined by ``|`` read without eval (None for
    anything else: the current value's type then stands for it)."""
    if not isinstance(kind, str):
        return kind
    names = [part.strip() for part in kind.split("|")]
    if not all(name in _NAMED for name in names):
        return None
    types_ = tuple(_NAMED[name] for name in names)
    return types_[0] if len(types_) == 1 else typing.Union[types_]  # noqa: UP007


def apply_overrides(name: str, config, overrides: ConfigOverrides):
    """``config`` with ``overrides`` set (the config object itself is changed: it was read
    for this load alone), or ProbeError in one line naming the key."""
    fields = family_fields(config)
    family = getattr(config, "model_type", "") or type(config).__name__
    for key, value in overrides.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ProbeError(f"{_config_of(name, family)} has no key {key!r}{hint}")
        kind = fields[key]
        if kind is None:  # no annotation: the value the config holds says the type
            current = getattr(config, key, None)
            kind = Any if current is None else type(current)
        if not _scalar(kind):
            raise ProbeError(
                f"{key} of {_config_of(name, family)} is not a number, true/false or a text: "
                "it cannot be set here"
            )
        accepted = _accepts(kind, value)
        if accepted is None:
            raise ProbeError(
                f"{key}={text_of(value)}: {key} of {_config_of(name, family)} takes "
                f"{_describe(kind)}, not {_GIVEN[type(value)]}"
            )
        try:
            setattr(config, key, accepted)
        except Exception as err:  # transformers' strict field check
            raise ProbeError(f"{point(name, overrides)}: {one_line(err)}") from None
    validate = getattr(config, "validate", None)
    if callable(validate):
        try:
            with quiet():  # transformers logs what it only warns about (token ids)
                validate()
        except Exception as err:
            raise ProbeError(f"{point(name, overrides)}: {one_line(err)}") from None
    return config


#: What a value given is, as an error line says it.
_GIVEN = {bool: "true/false", int: "a whole number", float: "a real number", str: "a text"}


def _config_of(name: str, family: str) -> str:
    return f"the config of {name}" if name == family else f"the {family} config of {name}"


def _accepts(kind, value):
    """``value`` as a field of type ``kind`` holds it (an int for a float field becomes a
    float), or None where the type does not take it."""
    if kind is Any:
        return value
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(kind):
            if arg is not float and (got := _accepts(arg, value)) is not None:
                return got  # an exact type first: int stays int in `float | int`
        return _accepts(float, value) if float in typing.get_args(kind) else None
    if origin is typing.Literal:
        return value if value in typing.get_args(kind) and type(value) is not bool else None
    if kind is bool:
        return value if isinstance(value, bool) else None
    if kind is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)
    if kind is str:
        return value if isinstance(value, str) else None
    return None  # lists, dicts, rope parameters: not settable from a KEY=VALUE


def _scalar(kind) -> bool:
    """Whether some value of a scalar type fits the field."""
    if kind is Any or kind in (bool, int, float, str):
        return True
    if typing.get_origin(kind) is typing.Literal:
        return True
    return any(
        _scalar(arg) for arg in typing.get_args(kind) if arg is not type(None)
    ) and typing.get_origin(kind) in (typing.Union, types.UnionType)


def _describe(kind) -> str:
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a text"}
    if kind in names:
        return names[kind]
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in typing.get_args(kind) if a is not type(None)]
        parts = [part for part in parts if part]
        return " or ".join(dict.fromkeys(parts))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(kind)))
    return ""
