"""Three sweeps, measured: residual scaling over depth, context length, training.

    python docs/data/sweep_studies.py                         # every study, write the tables
    python docs/data/sweep_studies.py --studies checkpoints   # one study
    python docs/data/sweep_studies.py --studies depth --families gpt2 --depths 2 4 8

Runs through ``probe.analyses.sweep.run`` (each point one ``probe collapse``, seed 0,
float32) and writes one Markdown table per study, with the machine and versions it ran on,
to ``docs/data/sweep_<study>.md`` (``docs/sweep.md`` includes them) and one figure per
sweep, ``probe``'s own sweep plot (``ds.probe.plot()``), to ``docs/sweep-<study>*.png``:

* ``checkpoints``: the checkpoint series shipped with probe, ``probe sweep gpt2-tiny-steps
  --init pretrained --sequences 8 --tokens 64``: per step, the final relative residual of
  every variant, the transformer's effective rank after the last layer, the sink rate and
  the largest massive ratio;
* ``depth``: Noci et al. (2022) at random init, depth x residual scale alpha in {1,
  1/sqrt(L)} for the GPT-2, Llama-3.2-1B and BERT configs (``probe sweep MODEL --init random
  --set <depth>=... --branch-scale 1,1/sqrt(L) --variants transformer,SAN --sequences 4
  --tokens 32``): the transformer's final relative residual and the mean cosine similarity
  of the tokens after its last layer;
* ``context``: Llama-3.2-1B's config at random init, cut to 2 of its 16 layers, over 64-2048
  tokens per sequence (2 sequences): the transformer's and SAN's final relative residual, the
  transformer's effective rank, the sink rate, the largest massive ratio.  The attention
  gap is not among a sweep's summaries, so it is not here.

Each sweep keeps its finished points in ``--out`` (``store=``) and its gathered result
there too; both are reused, so an interrupted run resumes where it stopped.  What this
2-core machine could not run (the deepest points, the longest contexts, Llama at its full
width) is cut by the arguments below and said in each table's note.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import numpy as np
import xarray as xr

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent
sys.path.insert(0, str(HERE))
from common import kept, note  # noqa: E402  (a sibling script, not a package)

LLAMA = "meta-llama/Llama-3.2-1B"
#: The depth study's families: (name shown, model, its depth field).
FAMILIES = {
    "gpt2": ("GPT-2", "gpt2", "n_layer"),
    "llama": ("Llama-3.2-1B", LLAMA, "num_hidden_layers"),
    "bert": ("BERT", "bert-base-uncased", "num_hidden_layers"),
}
#: Llama-3.2-1B narrowed for the depth study (2048 wide, 8192 MLP, 32 heads, 8 KV heads,
#: 128 per head in the real config): a quarter of the width keeps depth 32 within minutes.
LLAMA_NARROW = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
SCALES = ["1", "1/sqrt(L)"]


def sweep(model: str, init: str, sequences: int, tokens, store: Path, **grid) -> xr.Dataset:
    """``probe sweep`` through the library, its points kept in (and resumed from) ``store``;
    the gathered result is kept beside them as ``store``.nc."""
    from probe import Inputs, Model
    from probe.analyses import sweep as sweep_analysis

    def progress(done: int, total: int, label: str) -> None:
        print(f"  {store.name}: {done}/{total} {label}", flush=True)

    if isinstance(tokens, list):  # swept, not fixed
        grid, tokens = {**grid, "tokens": tokens}, None
    request = Model(model, init=init), Inputs(sequences=sequences, tokens=tokens)
    run = partial(sweep_analysis.run, *request, store=store, progress=progress, **grid)
    return kept(store.with_suffix(".nc"), run)


def save_figure(ds: xr.Dataset, name: str) -> None:
    fig = ds.probe.plot()
    fig.savefig(DOCS / name, dpi=90, bbox_inches="tight")


def last_layer(ds: xr.Dataset, name: str) -> xr.DataArray:
    """A per-layer variable after each point's last layer (the layers beyond are NaN)."""
    return ds[name].isel(layer=ds["n_layers"].astype(int))


def g(value) -> str:
    value = float(value)
    return "NaN" if not np.isfinite(value) else f"{value:.3g}"


def residual(value, ds: xr.Dataset) -> str:
    """A relative residual of the sweep ``ds``, under its precision floor written as such."""
    from probe.measures.stats import shown

    return shown(float(value), ds, missing="NaN")


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def sweep_note(command: str, sizes: str, datasets: list[xr.Dataset], extra: str = "") -> str:
    """The note above a study's table, with the time its points took."""
    from probe.reports.text import duration

    seconds = sum(float(ds["seconds"].sum()) for ds in datasets)
    return note(
        command, datasets, f"{sizes}, seed 0, float32; points ran {duration(seconds)}", extra
    )


def checkpoints(args) -> None:
    s, t = args.checkpoint_sequences, args.checkpoint_tokens
    ds = sweep("gpt2-tiny-steps", "pretrained", s, t, args.out / "checkpoints")
    save_figure(ds, "sweep-checkpoints.png")
    ds = ds.sel(init="pretrained")
    variants = [str(v) for v in ds.variant.values]
    head = ["step"] + [f"residual, {v}" for v in variants]
    head += ["effective rank, transformer", "sink rate", "max massive ratio"]
    rows = []
    for step in ds.step.values:
        p = ds.sel(step=step)
        rows.append([str(int(step))] + [residual(p["final_residual"].sel(variant=v), ds)
                                        for v in variants]
                    + [g(p["final_effective_rank"].sel(variant="transformer")),
                       g(p["sink_rate"]), g(p["max_massive_ratio"])])  # fmt: skip
    command = "python docs/data/sweep_studies.py --studies checkpoints"
    sizes = f"`probe sweep gpt2-tiny-steps --init pretrained`, {s} sequences x {t} tokens"
    text = sweep_note(command, sizes, [ds])
    write("sweep_checkpoints.md", text + table(head, rows))


def depth(args) -> None:
    s, t = args.depth_sequences, args.depth_tokens
    datasets, rows = [], []
    for key in args.families:
        shown, model, field = FAMILIES[key]
        config = {field: args.depths}
        if key == "llama" and not args.llama_full_width:
            config.update({k: [v] for k, v in LLAMA_NARROW.items()})
        ds = sweep(model, "random", s, t, args.out / f"depth-{key}", config=config,
                   branch_scale=SCALES, variants=["transformer", "SAN"])  # fmt: skip
        save_figure(ds, f"sweep-depth-{key}.png")
        datasets.append(ds)
        ds = ds.sel(init="random", variant="transformer")
        cosine = last_layer(ds, "cosine_similarity").mean("sequence")
        for d in ds[field].values:
            p = ds.sel({field: d})
            cells = [residual(p["final_residual"].sel(branch_scale=a), ds) for a in SCALES]
            cells += [g(cosine.sel({field: d, "branch_scale": a})) for a in SCALES]
            rows.append([shown, str(int(d))] + cells)
    head = ["config", "depth L", "residual, alpha = 1", "residual, alpha = 1/sqrt(L)",
            "cosine, alpha = 1", "cosine, alpha = 1/sqrt(L)"]  # fmt: skip
    narrow = " ".join(f"--set {k}={v}" for k, v in LLAMA_NARROW.items())
    extra = (
        f" Depths {', '.join(map(str, args.depths))}: depth 64 did not fit this shared "
        "2-core machine's time."
    )
    if "llama" in args.families and not args.llama_full_width:
        extra += f" Llama narrowed to a quarter of its width (`{narrow}`) for the same reason."
    command = "python docs/data/sweep_studies.py --studies depth"
    text = sweep_note(
        command,
        f"variants transformer and SAN, the transformer shown; {s} sequences x {t} tokens",
        datasets,
        extra,
    )
    write("sweep_depth.md", text + table(head, rows))


def context(args) -> None:
    s = args.context_sequences
    config = {"num_hidden_layers": [args.context_layers]} if args.context_layers else None
    ds = sweep(LLAMA, "random", s, args.context_tokens, args.out / "context", config=config,
               variants=["transformer", "SAN"])  # fmt: skip
    save_figure(ds, "sweep-context.png")
    ds = ds.sel(init="random")
    head = ["tokens", "residual, transformer", "residual, SAN", "effective rank, transformer",
            "sink rate", "max massive ratio"]  # fmt: skip
    rows = []
    for tokens in ds.tokens.values:
        p = ds.sel(tokens=tokens)
        rows.append([str(int(tokens))] + [residual(p["final_residual"].sel(variant=v), ds)
                    for v in ("transformer", "SAN")]
                    + [g(p["final_effective_rank"].sel(variant="transformer")),
                       g(p["sink_rate"]), g(p["max_massive_ratio"])])  # fmt: skip
    extra = ""
    if args.context_layers:
        extra = (f" Llama's config cut to {args.context_layers} of its 16 layers "
                 f"(`--set num_hidden_layers={args.context_layers}`) to fit this machine's time.")  # fmt: skip
    command = "python docs/data/sweep_studies.py --studies context"
    text = sweep_note(command, f"{s} sequences per context length", [ds], extra)
    write("sweep_context.md", text + table(head, rows))


def write(name: str, text: str) -> None:
    (HERE / name).write_text(text + "\n", encoding="utf-8")
    print(text, flush=True)


STUDIES = {"checkpoints": checkpoints, "depth": depth, "context": context}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", nargs="+", choices=list(STUDIES), default=list(STUDIES))
    parser.add_argument("--out", type=Path, default=Path("probe-reports/sweep-studies"))
    parser.add_argument("--checkpoint-sequences", type=int, default=8)
    parser.add_argument("--checkpoint-tokens", type=int, default=64)
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--depths", nargs="+", type=int, default=[2, 4, 8, 16, 32])
    parser.add_argument("--depth-sequences", type=int, default=4)
    parser.add_argument("--depth-tokens", type=int, default=32)
    parser.add_argument("--llama-full-width", action="store_true")
    parser.add_argument(
        "--context-tokens", nargs="+", type=int, default=[64, 128, 256, 512, 1024, 2048]
    )
    parser.add_argument("--context-sequences", type=int, default=2)
    parser.add_argument("--context-layers", type=int, default=2,
                        help="cut Llama's 16 layers to this many (0: all 16)")  # fmt: skip
    args = parser.parse_args()
    for study in args.studies:
        STUDIES[study](args)


if __name__ == "__main__":
    main()
