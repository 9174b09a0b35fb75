"""The parts of one ``probe collapse`` command, timed inside its own fresh process.

    python benchmarks/command_parts.py OUT.json collapse bert-base-uncased --init random \
        --sequences 2 --tokens 16 --quiet --out DIR

The process first imports what every collapse command imports before probe does anything
(``IMPORT_FLOOR`` of ``collapse_e2e.py``: the floor), then probe's command-line modules,
then runs the command as the ``probe`` executable does, with a timer around each of the
functions in ``PARTS``: the time spent in a part counts once, in the innermost part that
ran it (the self-test inside the model's load counts as the self-test).  OUT.json gets
each part's wall seconds, the floor, probe's imports, the whole process and the exit code.
Nothing in probe is changed: the timers wrap the functions where the modules hold them.
"""

from __future__ import annotations

import json
import os
import sys
import time

START = time.perf_counter()
exec(  # noqa: S102  (the floor is one line, shared with collapse_e2e.py)
    "import torch, transformers, nnsight, xarray, matplotlib.pyplot; "
    "from transformers import BertModel"
)
FLOOR = time.perf_counter() - START

#: module:function -> the part it is.
PARTS = {
    "probe.loading:load": "model build at random init (the draws)",
    "probe.surgery.self_test:verify": "self-test",
    "probe.measures.theory:layer_constants": "theory constants",
    "probe.analyses.collapse:execute": "forwards and metrics",
    "probe.reports:render": "report (figures and page)",
    "probe.files.staging:write_together": "writes",
    "probe.cli.output:write_index": "index",
}


def install(parts: dict[str, str], spent: dict[str, float]) -> None:
    """Wrap each function of ``parts`` in every probe module that holds it."""
    import functools
    import importlib

    stack: list[float] = []  # per running part: the time its inner parts took

    def timer(function, label):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            stack.append(0.0)
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                took = time.perf_counter() - began
                inner = stack.pop()
                spent[label] = spent.get(label, 0.0) + took - inner
                if stack:
                    stack[-1] += took

        return timed

    for where, label in parts.items():
        module_name, name = where.split(":")
        original = getattr(importlib.import_module(module_name), name)
        wrapped = timer(original, label)
        for module in list(sys.modules.values()):
            if (module.__name__ or "").startswith("probe"):
                for attribute, value in list(vars(module).items()):
                    if value is original:
                        setattr(module, attribute, wrapped)


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    # the executable's name, so that probe behaves as the command (probe/__init__.py)
    sys.argv = [os.path.join(os.path.dirname(sys.executable), "probe"), *argv]
    began = time.perf_counter()
    import probe.analyses.collapse  # noqa: F401
    import probe.cli.app  # noqa: F401
    import probe.cli.output  # noqa: F401
    import probe.reports  # noqa: F401
    import probe.surgery.self_test  # noqa: F401

    imports = time.perf_counter() - began
    spent = dict.fromkeys(PARTS.values(), 0.0)  # 0: not run (a constant kept from before)
    install(PARTS, spent)
    from probe.cli.entry import main as command

    code = 0
    try:
        command()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    total = time.perf_counter() - START
    found = {"floor": FLOOR, "probe imports": imports, "total": total, "exit": code, **spent}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(found, handle)


if __name__ == "__main__":
    main()
