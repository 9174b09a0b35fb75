"""The two ways to the top of the spectrum, side by side on one batch of real hidden states.

A random-init bert-base runs one batch (16 sequences) under an ablation; the metrics of all
its 13 layers at once (208 sequences of 768, as the collapse run's worker measures them)
are then taken

  (a) through the Krylov loop with the effective-rank estimate (``effective_rank=
      "estimate"``), what ``auto`` takes above ``metrics.EXACT_UP_TO_GPU`` on a GPU;
  (b) through dense eigensolves with the exact effective rank (``"exact"``, with
      ``probe.linalg.top``'s dense limit raised so the dense path runs at every size),
      what ``auto`` takes up to that k;

interleaved ``--repeats`` times after one warm-up each, and the medians and their ratio
are printed, with the largest differences between the two (relative residual absolute,
effective rank relative: the estimate's own error).  The table of docs/performance.md
"On a GPU" came from this script on an H100 (``--device cuda``); on a CPU ``auto`` is
exact and dense up to k = 256.

    python benchmarks/spectrum_paths.py [--device cuda] [--tokens 128,256]
                                        [--dtype float32,bfloat16] [--repeats 3]
"""

from __future__ import annotations

import argparse

import torch
from timing import interleaved_medians

import probe
from probe.linalg import top
from probe.measures import metrics
from probe.requests.inputs import make_inputs
from probe.surgery.ablate import PRESETS
from probe.surgery.trace import capture, layer_values


def compare(probed, tokens: int, variant: str, repeats: int) -> str:
    inputs = make_inputs(
        probed.tokenizer, probed.config.vocab_size, sequences=16, tokens=tokens, seed=0
    )
    _, ids, mask = next(iter(inputs.batches(16)))
    layers = layer_values(probed, ids, PRESETS[variant], capture, mask)
    X = torch.cat(layers)
    M = mask.bool().to(X.device).repeat(len(layers), 1)
    found = {}

    def krylov():
        found["krylov"] = metrics.collapse_metrics(X, M, effective_rank="estimate")

    def dense():
        limits = top.DENSE_UP_TO, top.DENSE_UP_TO_GPU
        top.DENSE_UP_TO = top.DENSE_UP_TO_GPU = X.shape[1]
        try:
            found["dense"] = metrics.collapse_metrics(X, M, effective_rank="exact")
        finally:
            top.DENSE_UP_TO, top.DENSE_UP_TO_GPU = limits

    times = interleaved_medians({"krylov": krylov, "dense": dense}, repeats, X.device)
    a, b = found["krylov"], found["dense"]
    residual = (a["relative_residual"] - b["relative_residual"]).abs().max().item()
    erank = ((a["effective_rank"] - b["effective_rank"]).abs() / b["effective_rank"]).max()
    return (
        f"{tuple(X.shape)} {variant:<11}  Krylov + estimate {times['krylov'] * 1e3:7.1f} ms  "
        f"dense + exact {times['dense'] * 1e3:7.1f} ms  ratio {times['krylov'] / times['dense']:.2f}x"
        f"  (largest differences: relative residual {residual:.1e}, effective rank "
        f"{erank.item():.1e} relative)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", default="128,256", help="comma list")
    parser.add_argument("--dtype", default="float32,bfloat16", help="comma list")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    try:
        sizes = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens takes whole numbers separated by commas, not {args.tokens!r}")
    if min(sizes) < 2:
        parser.error("--tokens: every size needs at least 2 tokens")
    for dtype in args.dtype.split(","):
        try:
            probed = probe.load("bert-base-uncased", init="random", device=args.device, dtype=dtype)
        except probe.ProbeError as err:
            parser.error(str(err))
        for tokens in sizes:
            for variant in ("SAN", "transformer"):
                line = compare(probed, tokens, variant, args.repeats)
                print(f"{args.device} {dtype:<8} {line}", flush=True)


if __name__ == "__main__":
    main()
