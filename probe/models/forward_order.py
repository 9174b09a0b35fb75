"""Where a layer's forward reaches a step: the order nnsight needs its reads and edits in.

The walker (:mod:`probe.models.spec`) reads and edits a layer in the order its forward
runs.  A family's own steps are written in that order; the LayerNorm variants composed with
a removed skip or MLP (``SAN/no-LN``, ...) add the norms' steps, which :func:`merged` places
among them from the forward sources nnsight reads (``.source``: a module's ops in order).
"""

from __future__ import annotations

import inspect
import math

from probe.errors import ProbeError

from .family import Step
from .weights import within


def merged(layer, steps: list[Step], norms: list[Step], family: str) -> list[Step]:
    """The spec's steps and the norm steps of a composed LayerNorm variant (``SAN/no-LN``,
    ...) in the order the layer's forward reaches them (nnsight's requirement).

    A step's place is read from the forward sources (``.source``, the ops in order): the
    first call of each module on its path, then its own input, the ops inside it, or its
    output.  A spec step's place is made no earlier than the one before it (the spec's
    steps are in forward order for this config).  A norm the spec reads is placed at that
    read: after its input, before its output.  A norm the layer calls through a helper
    (BERT's second norm, in its feed-forward chunk) comes after the spec's steps.  A norm
    the spec does not read, called from more than one place of the forward (the branches of
    a config), has no place that holds for every config: the variant is refused in one
    line.  A norm inside a module the spec's own edit replaces (a removed MLP's norm) takes
    no step of its own.
    """
    # A module whose own output the spec replaces (not an op inside it).
    edited = [s.module for s in steps if s.act != "read" and s.part == "output" and not s.op]
    # Sorted by (place, rank): a spec step's rank is its index; a norm at a spec read comes
    # just before that read (its index less a half), even where the read's place was lifted
    # to an earlier step's; any other norm comes before the spec's steps at its place.
    spec, read, last = [], {}, [-1]
    for index, step in enumerate(steps):
        last = max(forward_place(layer, step) or last, last)
        spec.append((last, index, step))
        if not step.op:
            read.setdefault(step.module, (last[:-1], index))
    ordered = list(spec)
    calls = list(layer.source.names)
    for step in norms:
        if within(step.module, edited):
            continue
        if step.module in read:
            place, index = read[step.module]
            ordered.append(([*place, math.inf], index - 0.5, step))
            continue
        top = step.module.split(".", 1)[0]
        if f"self_{top}_1" in calls:
            raise ProbeError(
                f"the {family} layer calls {step.module} from more than one place of its "
                "forward; its LayerNorm variants run only with skip and MLP kept here "
                "(LN-affine, no-LN)"
            )
        ordered.append((forward_place(layer, step) or [math.inf], -1, step))
    ordered.sort(key=lambda t: (t[0], t[1]))
    return [step for _, _, step in ordered]


def forward_place(layer, step: Step) -> list[float] | None:
    """Where the layer's forward reaches ``step``: the index of each module's first call on
    its path (``self.layer[1](`` of T5's list as that list's second call), then -1 (its
    input), the op's index (inside it) or inf (its output); None where a call is not in the
    source (made through a helper)."""
    place: list[float] = []
    envoy = layer
    parts = step.module.split(".") if step.module else []
    for i, name in enumerate(parts):
        if name.isdigit():
            continue  # counted with the list it indexes
        ops = list(envoy.source.names)
        item = parts[i + 1] if i + 1 < len(parts) and parts[i + 1].isdigit() else None
        call = f"self_{name}_{item}" if f"self_{name}_{item}" in ops else f"self_{name}_0"
        if call not in ops:
            return None
        place.append(ops.index(call))
        envoy = resolve_envoy(envoy, name if item is None else f"{name}.{item}")
    if step.op:
        ops = list(envoy.source.names)
        return place + [ops.index(step.op), math.inf] if step.op in ops else None
    return place + [math.inf if step.part == "output" else -1]


def resolve_envoy(envoy, path: str):
    """The envoy at a dotted module path; nnsight serves a submodule named like one of its
    own properties (BERT's ``output``) as ``E_<name>``."""
    from nnsight.intervention.envoy import Envoy

    obj = envoy
    for part in path.split("."):
        if part.isdigit():
            obj = obj[int(part)]
        elif inspect.isdatadescriptor(getattr(Envoy, part, None)):
            obj = getattr(obj, f"{Envoy.OVERLOAD_PREFIX}{part}")
        else:
            obj = getattr(obj, part)
    return obj
