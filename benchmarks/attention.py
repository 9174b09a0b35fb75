"""Cost of ``probe attention`` against the traced forwards of the same run.

Runs the same batches of a random-init model through

  (a) probe's traced forward capturing the residual stream X_0 .. X_L (``probe.hidden_states``:
      what every analysis pays before it measures anything),
  (b) the attention analysis' traced forward with every statistic reduced inside the trace
      (``analyses.attention.measure_batch``), the attention spectrum included,
  (c) the same without the spectrum (no singular values: sink score, top key, entropy,
      massive activations, anisotropy),

interleaved so that machine noise hits them alike, and prints the medians and the ratios
(b)/(a) and (c)/(a), of wall-clock time and of the process's CPU time (all threads: on a
machine shared with other work, the CPU time is the steadier of the two).  The goal is
(b)/(a) <= 1.3 at bert-base 32 x 128 and at the Llama-3.2-1B config at 4 x 1024 (on a GPU):

    python benchmarks/attention.py --model bert-base-uncased --batch 32 --tokens 128
    python benchmarks/attention.py --model meta-llama/Llama-3.2-1B --batch 4 --tokens 1024 \
        --device cuda
    python benchmarks/attention.py --layers 2 --batch 4 --tokens 64   # a CPU-sized check

``--layers N`` keeps the first N layers of the shipped config; all sides run the same N.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from timing import interleaved_medians, random_model

import probe
from probe.analyses.attention import measure_batch
from probe.measures.attention_stats import Totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers")
    args = parser.parse_args()

    probed = random_model(args.model, args.layers, args.device)
    device = probed.device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, probed.config.vocab_size, (args.batch, args.tokens), generator=generator)
    mask = torch.ones_like(ids)

    def attention(spectrum: bool):
        measure_batch(probed, ids, mask, Totals(probed.n_layers), 0, spectrum)

    cpu: dict[str, list[float]] = {}

    def cpu_timed(name, fn):
        def run():
            start = time.process_time()
            fn()
            cpu.setdefault(name, []).append(time.process_time() - start)

        return run

    runs = {
        "(a) traced forward (capture)": lambda: probe.hidden_states(probed, ids),
        "(b) attention, every statistic": lambda: attention(True),
        "(c) attention, no spectrum": lambda: attention(False),
    }
    runs = {name: cpu_timed(name, fn) for name, fn in runs.items()}
    medians = interleaved_medians(runs, args.repeats, device)
    cpu_medians = {name: statistics.median(v[1:]) for name, v in cpu.items()}  # [0]: warm-up
    depth = f", first {args.layers} layers" if args.layers else ""
    print(
        f"{args.model} (random init{depth}), {args.batch} x {args.tokens} tokens, {device}, "
        f"{probed.attn_implementation} attention, median of {args.repeats}"
    )
    print(f"  {'':34s} {'wall':>10s}    {'CPU':>10s}")
    for name, value in medians.items():
        print(f"  {name:34s} {value * 1000:10.1f} ms {cpu_medians[name] * 1000:10.1f} ms")
    for kind, times in (("wall", medians), ("CPU", cpu_medians)):
        base = times["(a) traced forward (capture)"]
        every = times["(b) attention, every statistic"] / base
        print(f"{kind}: (b)/(a) ratio {every:.2f}x (goal <= 1.3)", end="; ")
        print(f"(c)/(a) ratio {times['(c) attention, no spectrum'] / base:.2f}x")


if __name__ == "__main__":
    main()
