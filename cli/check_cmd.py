"""``probe check MODEL``: the self-test identities of probe's entry for one model, in a table."""

from __future__ import annotations

from typing import Annotated

from probe.errors import NothingToMeasure

from .console import checked, fail, in_cli_words, out
from .domains import ModelName, argument
from .options import Shared, shared_options


@shared_options("device", "config", "revision", init="random", dtype="float64", tokens=8)
def check(
    model: Annotated[
        str, argument("MODEL", ModelName(), help="A hub id, a local folder, or a shipped name.")
    ],
    *,
    shared: Shared,
) -> None:
    """Check that probe's entry fits MODEL: its modules, the self-test identities, the
    capabilities it enables (branch scaling, the LayerNorm variants, the path decomposition)."""
    import torch
    from rich.table import Table

    from probe.surgery.self_test import identities

    if shared.init == "both":
        fail("--init is pretrained or random for probe check")
    (request,) = shared.models([model])
    (probed,) = request.load(verify=False)
    checked()  # the model is loaded: warnings held so far may show
    if probed.adapter.inputs == "ids":
        limit = probed.adapter.max_tokens(probed.config)
        if limit is not None and shared.tokens > limit:
            fail(f"{model} takes at most {limit} tokens; use --tokens {limit} or fewer")
        from probe.requests import memory

        memory.require_run(probed, 1, shared.tokens, 1)  # one sequence, through every variant
        generator = torch.Generator().manual_seed(0)
        data = torch.randint(0, probed.config.vocab_size, (1, shared.tokens), generator=generator)
        found = identities(probed, data)
        if all(identity.holds(64 * torch.finfo(probed.dtype).eps) for identity in found):
            from probe.analyses.path_checks import decomposition_identities

            found += decomposition_identities(probed, data, torch.ones_like(data))
    else:
        found = identities(probed)
    stopped = [i.error for i in found if i.error.startswith(f"{NothingToMeasure.__name__}: ")]
    if stopped:  # the model's numbers, not the spec: the analyses would stop the same way
        fail(stopped[0].partition(": ")[2])
    table = Table(title=f"{model} · {probed.family} · {shared.init} · {shared.dtype}")
    for column in ("identity", "holds", "max |difference|", "size of values", "where"):
        table.add_column(column)
    eps = torch.finfo(probed.dtype).eps
    for identity in found:
        exact = not identity.error and identity.max_diff == 0.0
        table.add_row(
            identity.name,
            "exactly" if exact else ("to rounding" if identity.holds(64 * eps) else "NO"),
            f"{identity.max_diff:.3g}",
            f"{identity.scale:.3g}",
            in_cli_words(identity.error or identity.detail.strip()),
        )
    out.print(table)
    if all(identity.holds(64 * eps) for identity in found):
        out.print("all identities hold: probe's ablations are exact on this model")
    else:
        failing = next(i for i in found if not i.holds(64 * eps))
        field = f"; the entry's field at fault: {failing.field}" if failing.field else ""
        why = (
            f": {in_cli_words(failing.error)}" if failing.error else " (the table says by how much)"
        )
        fail(
            f"{failing.name} fails{field}{why}; probe refuses this model rather than give "
            "wrong numbers"
        )
