"""The families page's table of what each layer's number reads, from probe's family registry.

    python docs/data/hidden_states.py

Prints one row per family: where it reads layer 0 and layers 1..L, and the final norm that
HF applies after the last layer (its ``hidden_states[-1]`` is after that norm; probe's layer L is before it).
Nothing is measured: the rows come from the entries of ``probe.models.families`` and the
three families outside it.  The docs build writes the same table into ``docs/families.md``
(``docs/hooks/registry.py``), so it is never a file to regenerate.
"""

from __future__ import annotations

STYLES = {
    "post": "the layer's output, after its last LayerNorm",
    "pre": "the residual stream after the MLP's addition, before the next layer's norm",
    "sandwich": "the residual stream after the post-feedforward norm's addition",
    "parallel": "x + attention + MLP, the layer's output",
}
#: A style the config chooses: the two it can be.
BY_CONFIG = {"opt": ("pre", "post")}
#: The families outside the registry: (name, model types, layers 1..L, final norm)
OTHERS = (
    ("albert", "albert", STYLES["post"] + " (one shared layer, applied L times)", ""),
    ("xlnet", "xlnet", STYLES["post"] + " (the content stream)", ""),
    ("fastformer", "FastformerForCausalLM", "the layer's output (additive attention)", ""),
)


def by_config(name: str) -> str:
    """What a family whose config chooses pre-LN or its other style reads."""
    first, other = BY_CONFIG.get(name, ("pre", "parallel"))
    return f"by its config: {STYLES[first]} ({first}-LN), or {STYLES[other]} ({other})"


def rows() -> list[tuple[str, str, str, str]]:
    from probe.models.families import FAMILIES

    found = [
        (
            family.name,
            ", ".join(family.model_types),
            STYLES[family.style] if isinstance(family.style, str) else by_config(family.name),
            family.final_norm,
        )
        for family in FAMILIES
    ]
    return sorted(found + list(OTHERS))


def markdown_table() -> str:
    lines = [
        "| family | model types | layers 1..L read | final norm, after layer L (not in probe's "
        "layer L) |",
        "|---|---|---|---|",
    ]
    for name, types, reads, final in rows():
        lines.append(f"| {name} | {types} | {reads} | {f'`{final}`' if final else 'none'} |")
    return "\n".join(lines)


def main() -> None:
    print(markdown_table())


if __name__ == "__main__":
    main()
