"""Overhead of probe's traced runs against a plain HuggingFace forward.

Runs the same batch (a bert-base-sized random model, 16 x 128 tokens by
default) through

  (a) a plain forward with ``output_hidden_states=True``,
  (b) probe's traced run capturing the residual stream X_0 .. X_L,
  (c) probe's traced run under the SAN ablation, capturing the same,

interleaving the three so that machine noise hits them alike, and prints the
median times and the ratios (b)/(a) and (c)/(a).  Goals: both at most 1.15 for
BERT; at most 1.05 for a Llama-style model, whose operation-level edits go
through nnsight's ``.source``:

    python benchmarks/collapse_overhead.py [--repeats 5] [--device cuda]
    python benchmarks/collapse_overhead.py --model meta-llama/Llama-3.2-1B --layers 4 \
        --batch 4 --tokens 256

``--layers N`` keeps the first N layers of the (shipped) config, so a model of full
width runs in a CPU-sized time; both sides run the same N layers.
"""

from __future__ import annotations

import argparse

import torch
from timing import interleaved_medians, random_model

import probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers")
    args = parser.parse_args()

    probed = random_model(args.model, args.layers, args.device)
    device = probed.device
    ids = torch.randint(
        0,
        probed.config.vocab_size,
        (args.batch, args.tokens),
        generator=torch.Generator().manual_seed(0),
    )
    ids = ids.to(device)
    # The same forward arguments on both sides (a decoder builds no key/value cache).
    kwargs = probed.adapter.model_inputs(ids, torch.ones_like(ids))

    def plain():
        with torch.no_grad():
            probed.model(**kwargs, output_hidden_states=True)

    runs = {
        "(a) plain HF forward": plain,
        "(b) probe traced capture": lambda: probe.hidden_states(probed, ids),
        "(c) probe traced SAN": lambda: probe.hidden_states(probed, ids, probe.SAN),
    }
    medians = interleaved_medians(runs, args.repeats, device)
    depth = f", first {args.layers} layers" if args.layers else ""
    print(
        f"{args.model} (random init{depth}), {args.batch} x {args.tokens} tokens, {device}, "
        f"median of {args.repeats}"
    )
    for name, value in medians.items():
        print(f"  {name:28s} {value * 1000:9.1f} ms")
    base = medians["(a) plain HF forward"]
    print(f"(b)/(a) ratio {medians['(b) probe traced capture'] / base:.2f}x")
    print(f"(c)/(a) ratio {medians['(c) probe traced SAN'] / base:.2f}x")


if __name__ == "__main__":
    main()
