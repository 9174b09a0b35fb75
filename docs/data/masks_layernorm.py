"""The masks-and-LayerNorm page: Wu et al. (2024)'s experiment, run through probe.

    python docs/data/masks_layernorm.py

For each model, mask and variant it runs ``probe.hidden_states`` in float64 on seeded
inputs and measures, after every layer t, the paper's distance to rank one

    mu(X) = ||X - 1 gamma_X^T||_F,   gamma_X the token mean,

as the mean over sequences.  Then it fits log mu(X_t) = a + t log(rho) over the layers
whose relative distance mu(X_t) / ||X_t||_F is above the float64 precision floor and gives
rho, the rate per layer, with the fit's R^2: the fit a sweep's ``mu_rate`` summary makes
(``probe.measures.stats.rate_fit``); with fewer than three such layers the rate is missing
and says why.

Runs: the bert-base-uncased architecture at random init, 48 layers (seed 0, 8 sequences of
32 seeded token ids), SAN/no-LN (pure attention) and SAN (its LayerNorms kept); the
pretrained MiniLM (6 layers) and gpt2-tiny (3 layers, probe's shipped checkpoint), SAN/no-LN,
SAN, SAN+skip and transformer, on the sample text.  Writes ``docs/data/masks_layernorm.md``
(the page includes it) and ``docs/masks-layernorm.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import xarray as xr

import probe
from probe.measures import stats
from probe.names import FITS, NORMS

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import where  # noqa: E402  (sibling scripts)

MASKS = ("bidirectional", "causal", "window:2", "causal-window:2")
RANDOM = ("bert-base-uncased", {"num_hidden_layers": 48}, ("SAN/no-LN", "SAN"))
PRETRAINED = (
    ("minilm", {}, ("SAN/no-LN", "SAN", "SAN+skip", "transformer")),
    ("gpt2-tiny", {}, ("SAN/no-LN", "SAN", "SAN+skip", "transformer")),
)
FLOOR = stats.precision_floor("float64")  # the relative distance below which rounding rules
FLOAT64 = xr.Dataset(attrs={"dtype": "float64"})  # what stats.shown reads a run's floor from


def mu(states: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the means over sequences of mu(X_t) = ||X - 1 mean(X)^T||_F and of
    mu(X_t) / ||X_t||_F, the relative distance that is judged against the precision floor."""
    found = [probe.metrics.collapse_metrics(x, metrics="relative_residual") for x in states]
    relative = [r["relative_residual"][:, FITS.index("mean"), NORMS.index("fro")] for r in found]
    return (
        np.array([float(r["mu"].mean()) for r in found]),
        np.array([float(r.mean()) for r in relative]),
    )


def rate(values: np.ndarray, relative: np.ndarray) -> dict:
    """The fitted rate per layer of mu, as a sweep's summary fits it
    (``probe.measures.stats.rate_fit``, over the layers above the float64 floor)."""
    return stats.rate_fit(values, relative, FLOOR)


def run(name: str, init: str, config: dict, variants, seed: int = 0) -> dict:
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
            found[mask_text, variant] = mu(states)
    return found


def table(title: str, found: dict) -> list[str]:
    lines = [f"**{title}**", ""]
    lines.append(
        "| mask | variant | mu(X_0) | mu(X_L) | mu(X_L) / ‖X_L‖ | rate per layer | R² (layers fitted) |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for (mask, variant), (values, relative) in found.items():
        fitted = rate(values, relative)
        if np.isfinite(fitted["rate"]):
            shown, quality = f"{fitted['rate']:.3g}", f"{fitted['r2']:.3f} ({fitted['layers']})"
        else:
            shown, quality = stats.rate_text(fitted, FLOOR, "float64", missing="—"), "—"
        cells = [f"`{mask}`", f"`{variant}`", f"{values[0]:.3g}", f"{values[-1]:.3g}"]
        cells += [stats.shown(relative[-1], FLOAT64), shown, quality]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def figure(results: list[tuple[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (title, found) in zip(axes[0], results, strict=True):
        for (mask, variant), (values, _) in found.items():  # (mu, relative) per layer
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
