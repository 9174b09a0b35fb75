"""End to end: the whole collapse analysis against the forward passes it needs.

For each size, a random-init model is loaded once; then, interleaved ``--repeats`` times,

  (a) the forwards: every batch of the analysis under each of the four ablations (SAN,
      SAN+MLP, SAN+skip, transformer) through ``probe.trace.layer_values`` with the trivial
      reduction, so the residual stream X_0 .. X_L is captured and nothing else is computed;
  (b) the analysis: ``collapse.run`` on the preloaded model (same inputs, same batches, all
      four variants, all metrics), Dataset included;

and, with ``--cli``,

  (c) the command itself, ``probe collapse MODEL --init random`` with the same settings, in a
      fresh process (start-up, model construction, result, report and index included);

and the medians and the ratios (b)/(a) and (c)/(a) are printed.  Goal (issue 7): at most
1.3x on CPU and 1.5x on CUDA.

    python benchmarks/collapse_e2e.py [--sizes bert-32x128,bert-128x512,gpt2-32x1024]
                                      [--device cpu,cuda] [--repeats 3] [--batch-size 16]
                                      [--cli]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import probe
from probe.ablate import PRESETS, parse_variants
from probe.analyses import collapse
from probe.inputs import make_inputs
from probe.trace import capture, layer_values

SIZES = {
    "bert-32x128": ("bert-base-uncased", 32, 128),
    "bert-128x512": ("bert-base-uncased", 128, 512),
    "gpt2-32x1024": ("gpt2", 32, 1024),
}


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def bench(
    model: str, sequences: int, tokens: int, device: str, repeats: int, batch: int, cli: bool
):
    probed = probe.load(model, init="random", device=device)
    # The very inputs and batches collapse.run makes for these settings.
    inputs = make_inputs(
        probed.tokenizer, probed.config.vocab_size, sequences=sequences, tokens=tokens, seed=0
    )
    batches = [(ids, mask) for _, ids, mask in inputs.batches(batch)]
    variants = parse_variants("all")

    def forwards():
        for variant in variants:
            for ids, mask in batches:
                layer_values(probed, ids, PRESETS[variant], capture, mask)

    def analysis():
        collapse.run(
            probed,
            variants="all",
            init="random",
            sequences=sequences,
            tokens=tokens,
            seed=0,
            batch_size=batch,
        )

    def command():
        # The whole job as a user runs it: a fresh process that builds the model, probes it,
        # writes the result, its report and the index.
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(
                [sys.executable, "-m", "probe.cli", "collapse", model, "--init", "random",
                 "--sequences", str(sequences), "--tokens", str(tokens), "--seed", "0",
                 "--batch-size", str(batch), "--device", device, "--quiet", "--out", out],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip

    runs = {"(a) forwards": forwards, "(b) collapse.run": analysis}
    if cli:
        runs["(c) probe collapse"] = command
    # Warm-up on one batch (nnsight's wrapper, allocators, lazy imports, the LAPACK pool):
    # the same code paths, without doubling the time of the large sizes.
    ids, mask = batches[0]
    layer_values(probed, ids, PRESETS[variants[0]], capture, mask)
    collapse.run(probed, variants="all", init="random", sequences=ids.shape[0], tokens=tokens)
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn, probed.device))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"from {', '.join(SIZES)}")
    default_devices = "cpu,cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_devices, help="comma list: cpu, cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--cli", action="store_true", help="also time `probe collapse` itself, in a fresh process"
    )
    args = parser.parse_args()
    sizes = [name.strip() for name in args.sizes.split(",") if name.strip()]
    unknown = [name for name in sizes if name not in SIZES]
    if unknown:
        parser.error(f"unknown size {', '.join(unknown)}; choose from {', '.join(SIZES)}")

    for device in [d.strip() for d in args.device.split(",") if d.strip()]:
        for name in sizes:
            model, sequences, tokens = SIZES[name]
            medians = bench(
                model, sequences, tokens, device, args.repeats, args.batch_size, args.cli
            )
            forwards, analysis = medians["(a) forwards"], medians["(b) collapse.run"]
            line = (
                f"{name:13s} {device:5s} forwards {forwards:8.2f} s  collapse.run "
                f"{analysis:8.2f} s  ratio {analysis / forwards:.2f}x"
            )
            if args.cli:
                job = medians["(c) probe collapse"]
                line += f"  probe collapse {job:8.2f} s  ratio {job / forwards:.2f}x"
            print(f"{line}  (median of {args.repeats}, batch {args.batch_size})", flush=True)


if __name__ == "__main__":
    main()
