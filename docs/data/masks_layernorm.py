"""The masks-and-LayerNorm page: Wu et al. (2024)'s experiment, run through probe.

    python docs/data/masks_layernorm.py

For each model, mask and variant it runs ``probe.hidden_states`` in float64 on seeded
inputs and measures, after every layer t, the paper's distance to rank one

    mu(X) = ||X - 1 gamma_X^T||_F,   gamma_X the token mean,

as the mean over sequences.  Then it fits log mu(X_t) = a + t log(rho) over the layers
whose mu is above the float64 floor (1e-12 of mu(X_0)) and gives rho, the rate per layer,
with the fit's R^2; with fewer than three such layers the rate is missing and says why.

Runs: the bert-base-uncased architecture at random init, 48 layers (seed 0, 8 sequences of
32 seeded token ids), SAN/no-LN (pure attention) and SAN (its LayerNorms kept); the
pretrained MiniLM (6 layers) and gpt2-tiny (3 layers, probe's shipped checkpoint), SAN/no-LN,
SAN, SAN+skip and transformer, on the sample text.  Writes ``docs/data/masks_layernorm.md``
(the page includes it) and ``docs/masks-layernorm.png``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import where  # noqa: E402  (sibling scripts)

MASKS = ("bidirectional", "causal", "window:2", "causal-window:2")
RANDOM = ("bert-base-uncased", {"num_hidden_layers": 48}, ("SAN/no-LN", "SAN"))
PRETRAINED = (
    ("minilm", {}, ("SAN/no-LN", "SAN", "SAN+skip", "transformer")),
    ("gpt2-tiny", {}, ("SAN/no-LN", "SAN", "SAN+skip", "transformer")),
)
FLOOR = 1e-12  # relative to mu(X_0): float64 rounding of the layers' sums lies below


def mu(states: list[torch.Tensor]) -> np.ndarray:
    """mu(X_t) per layer, the mean over sequences of ||X - 1 mean(X)^T||_F."""
    return np.array(
        [float((x - x.mean(dim=1, keepdim=True)).norm(dim=(1, 2)).mean()) for x in states]
    )


def relative(states: list[torch.Tensor]) -> float:
    """mu(X_L) / ||X_L||_F after the last layer, mean over sequences: collapse apart from
    a shrinking or growing norm (probe's relative residual, Frobenius norm, mean fit)."""
    x = states[-1]
    res = (x - x.mean(dim=1, keepdim=True)).norm(dim=(1, 2))
    return float((res / x.norm(dim=(1, 2))).mean())


def rate(values: np.ndarray) -> tuple[float, float, str]:
    """(rho, R^2, why missing): the exponential rate per layer of mu over the layers above
    the floor."""
    above = [t for t, v in enumerate(values) if v > FLOOR * values[0]]
    if len(above) < 3:
        return math.nan, math.nan, f"{len(above)} layers above the float64 floor"
    t = np.array(above, dtype=float)
    y = np.log(values[above])
    slope, intercept = np.polyfit(t, y, 1)
    fitted = intercept + slope * t
    r2 = 1 - float(((y - fitted) ** 2).sum()) / float(((y - y.mean()) ** 2).sum() or 1.0)
    return math.exp(slope), r2, ""


def run(name: str, init: str, config: dict, variants, seed: int = 0) -> dict:
    import probe
    from probe.requests.inputs import model_inputs
    from probe.surgery import masks
    from probe.surgery.ablate import PRESETS

    request = probe.Model(name, init=init, dtype="float64", seed=seed, config=config or None)
    (probed,) = request.load()
    given = probe.Inputs(sequences=8, tokens=32)  # the sample text, or seeded ids
    encoded = model_inputs(probed, given, seed=seed)
    found = {}
    for mask_text in MASKS:
        mask = masks.parse_mask(mask_text)
        masks.check(probed, mask)
        for variant in variants:
            with masks.applied([probed], mask):
                states = probe.hidden_states(
                    probed, encoded.input_ids, PRESETS[variant], encoded.attention_mask
                )
            found[mask_text, variant] = (mu(states), relative(states))
    return found


def table(title: str, found: dict) -> list[str]:
    lines = [f"**{title}**", ""]
    lines.append("| mask | variant | mu(X_0) | mu(X_L) | mu(X_L) / ‖X_L‖ | rate per layer | R² |")
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for (mask, variant), (values, r_last) in found.items():
        rho, r2, why = rate(values)
        shown = f"{rho:.3g}" if not why else f"— ({why})"
        quality = f"{r2:.3f}" if not why else "—"
        cells = [f"`{mask}`", f"`{variant}`", f"{values[0]:.3g}", f"{values[-1]:.3g}"]
        cells += [f"{r_last:.3g}", shown, quality]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def figure(results: list[tuple[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (title, found) in zip(axes[0], results, strict=True):
        for (mask, variant), (values, _) in found.items():
            if variant not in ("SAN/no-LN", "SAN"):
                continue
            layers = np.arange(1, len(values) + 1)  # t + 1: a log axis has no 0
            style = "-" if variant == "SAN/no-LN" else "--"
            ax.loglog(layers, np.maximum(values, 1e-300), style, label=f"{mask}, {variant}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer t + 1")
        ax.set_ylabel("mu(X_t)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    results = []
    name, config, variants = RANDOM
    results.append((f"{name}, random init, 48 layers", run(name, "random", config, variants)))
    for name, config, variants in PRETRAINED:
        results.append((f"{name}, pretrained", run(name, "pretrained", config, variants)))
    import datetime
    import subprocess

    day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    command = "python docs/data/masks_layernorm.py"
    lines = [f"*Measured on {where()}, on {day} (UTC), commit {commit}, by `{command}`.*", ""]
    for title, found in results:
        lines += table(title, found)
    (HERE / "masks_layernorm.md").write_text("\n".join(lines))
    figure(results, HERE.parent / "masks-layernorm.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
