"""Config overrides: a model's config with some of its fields changed, at random init.

``probe.Model("gpt2", init="random", config={"n_layer": 4})`` builds GPT-2's architecture
with 4 layers instead of 12 (on the command line, the shared option ``set n_layer=4``).
An override changes the architecture, so it applies to random weights only; it is applied
to the family's config before the model is built (:mod:`probe.loading.config_edits` checks
each key and value against that config, in one line each).

:class:`ConfigOverrides` is the frozen, ordered (by key), hashable value a request keeps;
:func:`parse_setting` reads one ``KEY=VALUE`` of the command line: a whole number, a real
number, ``true``/``false``, or else the text itself.  Only scalars can be set.

Nothing here imports torch: the command line builds a request before it loads anything.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping

from probe.errors import ProbeError
from probe.requests.checks import clipped, plain

#: What a config key looks like (a Python identifier).
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?")
#: Longest key or text value accepted (a config field is far shorter).
MAX_TEXT = 200


class ConfigOverrides(Mapping):
    """Config keys -> scalar values (bool, int, float, str), frozen and sorted by key.

    A :class:`~collections.abc.Mapping` (``overrides["n_layer"]``), hashable, equal to any
    mapping with the same items, printed as ``n_layer=4, initializer_range=0.02``.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping | None = None) -> None:
        # A numpy scalar (np.int64(4)) is kept as the Python number it holds.
        given = {key: plain(value) for key, value in dict(items or {}).items()}
        for key, value in given.items():
            _check_item(key, value)
        object.__setattr__(self, "_items", tuple(sorted(given.items())))

    def __setattr__(self, name, value):
        raise AttributeError("ConfigOverrides is frozen")

    def __getitem__(self, key: str):
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other.items())

    def __repr__(self) -> str:
        return f"ConfigOverrides({dict(self._items)!r})"

    def __str__(self) -> str:
        return ", ".join(f"{key}={text_of(value)}" for key, value in self._items)

    def json(self) -> str:
        """The overrides as canonical JSON (sorted keys): what results record."""
        return json.dumps(dict(self._items), sort_keys=True)

    def settings(self) -> list[str]:
        """``KEY=VALUE`` for each, in key order, as :func:`parse_setting` reads them back."""
        return [f"{key}={text_of(value)}" for key, value in self._items]


def freeze(config) -> ConfigOverrides | None:
    """A request's ``config``: None or empty -> None; a mapping -> :class:`ConfigOverrides`."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise ProbeError(
            f"`config` takes a mapping of config keys to values, got {type(config).__name__}"
        )
    return ConfigOverrides(config) if config else None


def _check_item(key, value) -> None:
    if not isinstance(key, str) or not _KEY.fullmatch(key) or len(key) > MAX_TEXT:
        raise ProbeError(f"`config` key {key!r} is not a config field name")
    if isinstance(value, float) and not math.isfinite(value):
        raise ProbeError(f"`config` {key}={value!r}: give a finite number")
    if isinstance(value, str) and (len(value) > MAX_TEXT or "\0" in value):
        raise ProbeError(f"`config` {key}: the text value is too long or holds a NUL character")
    if not isinstance(value, bool | int | float | str):
        raise ProbeError(
            f"`config` {key}: only a number, true/false or a text can be set, "
            f"got {type(value).__name__}"
        )


def text_of(value) -> str:
    """A value as ``KEY=VALUE`` writes it (``true``, ``4``, ``0.02``, ``relu``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def parse_setting(text: str) -> tuple[str, bool | int | float | str]:
    """``KEY=VALUE`` -> (key, value): a whole number, a real number, true/false, else text."""
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    if not sep or not key:
        raise ProbeError(f"`config` takes KEY=VALUE, like n_layer=4; got {text!r}")
    if raw == "":
        raise ProbeError(f"`config` {key}= has no value; give KEY=VALUE, like n_layer=4")
    value = value_of(key, raw)
    _check_item(key, value)
    return key, value


#: The longest whole number a config value is read from: beyond a 64-bit integer already.
LONGEST = 40


def value_of(key: str, raw: str) -> bool | int | float | str:
    """A config value as typed: a whole number (ASCII digits), a real number, true/false,
    else the text; a number no config field holds (over 40 digits, or not finite) refused."""
    if _INT.fullmatch(raw):
        digits = raw.lstrip("+-0")
        if len(digits) > LONGEST:
            raise ProbeError(
                f"`config` {key}: a whole number of {len(digits)} digits ({clipped(raw)}); "
                "no config field holds one over 64 bits"
            )
        return int(raw)
    if _FLOAT.fullmatch(raw):
        value = float(raw)
        if not math.isfinite(value):
            raise ProbeError(f"`config` {key}={clipped(raw)}: give a finite number")
        return value
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def parse_settings(texts) -> ConfigOverrides | None:
    """Several ``KEY=VALUE`` (a key at most once) -> the overrides, or None for none."""
    found: dict = {}
    for text in texts or ():
        key, value = parse_setting(text)
        if key in found:
            raise ProbeError(f"`config` sets {key} twice; give each key once")
        found[key] = value
    return freeze(found)
