"""Cost of the exact path-length decomposition (``probe.measures.frozen.path_terms``).

1. A bert-base-sized random model (12 layers, 12 heads, hidden 768) on 4 x 128
   tokens, float64: the programme's time as a ratio to one plain forward pass
   of the same model in the same dtype, and to L+1 forward passes.
   Goal: the programme within 3x the time of L+1 forward passes.
2. The programme against brute-force enumeration of all (H+1)^L paths
   (tests/reference/path_enumeration.py) on a small model where enumeration is
   still feasible, with the largest difference between the two.

Runs are interleaved so that machine noise hits them alike; medians are printed.

    python benchmarks/paths_decompose.py [--repeats 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from timing import interleaved_medians

import probe
from probe.analyses.path_decompose import frozen_run
from probe.measures import frozen

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.reference


def _setup(probed, batch: int, tokens: int):
    ids = torch.randint(
        0, probed.config.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(0)
    ).to(probed.device)
    weights = [probed.adapter.layer_weights(probed.model, i) for i in range(probed.n_layers)]
    run = frozen_run(probed, weights, ids, torch.ones_like(ids))
    return ids, run


def bert_base(args) -> None:
    probed = probe.load("bert-base-uncased", init="random", device=args.device, dtype="float64")
    device = probed.device
    ids, run = _setup(probed, args.batch, args.tokens)

    def forward():
        with torch.no_grad():
            probed.model(ids)

    def programme():
        frozen.path_terms(run["layers"], run["x0"], run["final"])

    medians = interleaved_medians(
        {"forward": forward, "programme": programme}, args.repeats, device
    )
    f, p = medians["forward"], medians["programme"]
    L = probed.n_layers
    print(f"bert-base-sized, {args.batch} x {args.tokens} tokens, float64, {device}:")
    print(f"  one forward pass  {f * 1e3:9.1f} ms")
    print(f"  programme         {p * 1e3:9.1f} ms")
    print(f"  programme / forward          = {p / f:.2f}")
    print(f"  programme / ({L}+1) forwards  = {p / ((L + 1) * f):.2f}   (goal <= 3)")


def against_enumeration(args) -> None:
    from tests.paths_tiny import ids as tiny_ids
    from tests.paths_tiny import tiny_paths_model
    from tests.reference.path_enumeration import FrozenReference

    L, H = args.small_layers, args.small_heads
    model = tiny_paths_model("bert", layers=L, heads=H)
    probed = probe.wrap(model)
    batch = tiny_ids(2, 16)
    weights = [probed.adapter.layer_weights(model, i) for i in range(L)]
    run = frozen_run(probed, weights, batch, torch.ones_like(batch))
    reference = FrozenReference(model, run["x0"], run["attn"], run["norm_inputs"])
    results = {}

    def programme():
        results["programme"] = frozen.path_terms(run["layers"], run["x0"])[0][-1]

    def enumeration():
        results["enumeration"] = reference.by_length()

    runs = {"programme": programme, "enumeration": enumeration}
    medians = interleaved_medians(runs, args.repeats, probed.device)
    p, e = medians["programme"], medians["enumeration"]
    diff = max(
        float((a - b).abs().max())
        for a, b in zip(results["programme"], results["enumeration"], strict=True)
    )
    print(f"L={L}, H={H} ({(H + 1) ** L} paths), 2 x 16 tokens, hidden 32, float64:")
    print(f"  programme         {p * 1e3:9.2f} ms")
    print(f"  enumeration       {e * 1e3:9.2f} ms")
    print(f"  enumeration / programme      = {e / p:.0f}")
    print(f"  largest difference           = {diff:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small-layers", type=int, default=4)
    parser.add_argument("--small-heads", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    bert_base(args)
    against_enumeration(args)


if __name__ == "__main__":
    main()
