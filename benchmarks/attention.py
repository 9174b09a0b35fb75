"""Cost of ``probe attention`` against the traced forwards of the same run.

Runs the same batches of a random-init model through

  (a) probe's traced forward capturing the residual stream X_0 .. X_L (``probe.hidden_states``:
      what every analysis pays before it measures anything),
  (b) the attention analysis' traced forward with every statistic reduced inside the trace
      (``analyses.attention.measure_batch``), the attention spectrum included,
  (c) the same without the spectrum (no singular values: sink score, top key, entropy,
      massive activations, anisotropy),

interleaved so that machine noise hits them alike, and prints the medians and the ratios
(b)/(a) and (c)/(a).  The issue's goal is (b)/(a) <= 1.3 at bert-base 32 x 128 and at the
Llama-3.2-1B config at 4 x 1024 (on a GPU):

    python benchmarks/attention.py --model bert-base-uncased --batch 32 --tokens 128
    python benchmarks/attention.py --model meta-llama/Llama-3.2-1B --batch 4 --tokens 1024 \
        --device cuda
    python benchmarks/attention.py --layers 2 --batch 4 --tokens 64   # a CPU-sized check

``--layers N`` keeps the first N layers of the shipped config; all sides run the same N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import probe
from probe.analyses.attention import measure_batch
from probe.attention_stats import Totals


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
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers")
    args = parser.parse_args()

    probed = _load(args.model, args.layers, args.device)
    device = probed.device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, probed.config.vocab_size, (args.batch, args.tokens), generator=generator)
    mask = torch.ones_like(ids)

    def attention(spectrum: bool):
        measure_batch(probed, ids, mask, Totals(probed.n_layers), 0, spectrum)

    runs = {
        "(a) traced forward (capture)": lambda: probe.hidden_states(probed, ids),
        "(b) attention, every statistic": lambda: attention(True),
        "(c) attention, no spectrum": lambda: attention(False),
    }
    for fn in runs.values():  # warm-up: nnsight wraps the model, allocators settle
        fn()
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn, device))
    medians = {name: statistics.median(values) for name, values in times.items()}
    depth = f", first {args.layers} layers" if args.layers else ""
    print(
        f"{args.model} (random init{depth}), {args.batch} x {args.tokens} tokens, {device}, "
        f"{probed.attn_implementation} attention, median of {args.repeats}"
    )
    for name, value in medians.items():
        print(f"  {name:34s} {value * 1000:10.1f} ms")
    base = medians["(a) traced forward (capture)"]
    print(f"(b)/(a) ratio {medians['(b) attention, every statistic'] / base:.2f}x (goal <= 1.3)")
    print(f"(c)/(a) ratio {medians['(c) attention, no spectrum'] / base:.2f}x")


def _load(name: str, layers: int | None, device: str):
    if layers is None:
        return probe.load(name, init="random", device=device)
    from transformers import AutoConfig, AutoModel

    from probe.loading import bundled_configs

    config = AutoConfig.for_model(**json.loads(bundled_configs()[name].read_text()))
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager")
    return probe.wrap(model, name=name, init="random", device=device)


if __name__ == "__main__":
    main()
