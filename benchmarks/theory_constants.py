"""The theory panel's constants: every head's products side by side against one at a time.

For each model (random init), ``probe.measures.theory.layer_constants`` runs

  (a) with each layer's products (each head's W_QK and W_V W_O, the MLP's two matrices) one
      at a time in one serial thread;
  (b) as probe runs them, the products side by side in ``probe.linalg.lapack.serial_threads``
      (as many serial threads as torch's intra-op setting);

interleaved ``--repeats`` times after one warm-up each; the medians, their ratio (b)/(a),
and whether the constants are the same bit for bit (they must be: each norm is the same
serial code, whichever thread runs it).  Run it on a quiet machine: the ratio is the
CPU's, and on 2 cores another job takes the second core away.

    python benchmarks/theory_constants.py [--models bert-base-uncased,gpt2] [--repeats 3]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from timing import interleaved_medians

import probe
from probe.linalg import lapack
from probe.measures import theory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert-base-uncased,gpt2")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    one = ThreadPoolExecutor(1, initializer=lapack._one_thread)
    side_by_side = theory._serial_pool
    cpu = torch.device("cpu")
    for name in (n.strip() for n in args.models.split(",") if n.strip()):
        probed = probe.load(name, init="random", seed=0)
        found = {}

        def run(pool, key, probed=probed, found=found):
            def constants():
                theory._serial_pool = pool
                try:
                    found[key] = theory.layer_constants(probed)
                finally:
                    theory._serial_pool = side_by_side

            return constants

        medians = interleaved_medians(
            {"one": run(lambda device: one, "one"), "side": run(side_by_side, "side")},
            args.repeats,
            cpu,
        )
        same = all(
            np.array_equal(found["one"][k], found["side"][k], equal_nan=True)
            for k in ("qk", "vo", "beta", "lambda")
        )
        print(
            f"{name:24s} one thread {medians['one']:7.3f} s  side by side "
            f"({torch.get_num_threads()} threads) {medians['side']:7.3f} s  ratio "
            f"{medians['side'] / medians['one']:.2f}  same bits: {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
