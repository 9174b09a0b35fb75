"""The ``probe`` command that reproduces a result, rendered from the request it records.

A result made by the command line records that command (attribute ``command``).  One made in
Python records its request as data instead (attribute ``request``, written by
:func:`probe.requests.request.record`: the analysis, the model's and the inputs' fields, and the
analysis's own options, each as the library names it), and this module renders the command
line that asks for the same: the library keeps no command line, the command line's words
live here and in ``probe.cli``.  A model passed as an object has no command: its result
records the Python call instead.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

#: Option values the command line spells otherwise than the library: metric names.
_DASHED = ("metrics",)


def command_line(attrs: Mapping) -> str:
    """The command that made a result, or the one that reproduces its recorded request.

    Parameters
    ----------
    attrs
        A result's attributes (`ds.attrs`): its `command`, or its `request` as
        `probe.requests.request.record` wrote it.

    Returns
    -------
    str
        The `probe` command line; "" for a result that records neither.
    """
    if attrs.get("command"):
        return str(attrs["command"])
    request = attrs.get("request")
    return render(json.loads(request)) if request else ""


def render(request: Mapping) -> str:
    """``probe ANALYSIS MODEL --init ... OPTIONS --seed ... INPUTS`` for a recorded request:
    the model's name and init, the analysis's own options, the model's other fields, then the
    inputs' (the order the command line prints its help in)."""
    model = dict(request["model"])
    args = ["probe", *str(request["analysis"]).split(), str(model.pop("source"))]
    args += ["--init", str(model.pop("init"))]
    for name, value in request.get("options", {}).items():
        if name in _DASHED:
            value = str(value).replace("_", "-")
        args += _option(name, value)
    for name, value in model.items():
        if name == "config":
            args += [arg for setting in value for arg in ("--set", setting)]
        else:
            args += _option(name, value)
    for name, value in request.get("inputs", {}).items():
        args += _option(name, value)
    return shlex.join(args)


def _option(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    return [flag] if value is True else [flag, str(value)]
