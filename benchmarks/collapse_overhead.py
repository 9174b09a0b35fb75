"""Overhead of probe's traced runs against a plain HuggingFace forward.

Runs the same batch (a bert-base-sized random model, 16 x 128 tokens by
default) through

  (a) a plain forward with ``output_hidden_states=True``,
  (b) probe's traced run capturing the residual stream X_0 .. X_L,
  (c) probe's traced run under the SAN ablation, capturing the same,

interleaving the three so that machine noise hits them alike, and prints the
median times and the ratios (b)/(a) and (c)/(a).  Goal: both at most 1.15.

    python benchmarks/collapse_overhead.py [--repeats 5] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import probe


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    probed = probe.load(args.model, init="random", device=args.device)
    device = probed.device
    ids = torch.randint(
        0,
        probed.config.vocab_size,
        (args.batch, args.tokens),
        generator=torch.Generator().manual_seed(0),
    )
    ids = ids.to(device)

    def plain():
        with torch.no_grad():
            probed.model(ids, output_hidden_states=True)

    runs = {
        "(a) plain HF forward": plain,
        "(b) probe traced capture": lambda: probe.hidden_states(probed, ids),
        "(c) probe traced SAN": lambda: probe.hidden_states(probed, ids, probe.SAN),
    }
    for fn in runs.values():  # warm-up: nnsight wraps the model, allocators settle
        fn()
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn, device))

    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"{args.model} (random init), {args.batch} x {args.tokens} tokens, {device}, median of {args.repeats}"
    )
    for name, value in medians.items():
        print(f"  {name:28s} {value * 1000:9.1f} ms")
    base = medians["(a) plain HF forward"]
    print(f"(b)/(a) ratio {medians['(b) probe traced capture'] / base:.2f}x")
    print(f"(c)/(a) ratio {medians['(c) probe traced SAN'] / base:.2f}x")


if __name__ == "__main__":
    main()
