"""collapse.run on a machine another job keeps busy, against the same run on a quiet one.

Researchers run probe beside other jobs.  This benchmark measures, for one size (bert-base
at random init, 8 x 512 by default):

  (a) the forwards: every batch under the four ablations, the residual stream captured and
      nothing else computed (as ``collapse_e2e.py``'s (a));
  (b) ``collapse.run`` on the same model and inputs, all variants and metrics;

interleaved ``--repeats`` times, first on a quiet machine and then beside a fixed competing
load: ``--load`` processes of its own, each a Python loop that never sleeps (one core's
worth of work apiece), started before and stopped after the loaded runs.  It prints the
ratio (b)/(a) quiet and loaded, how much worse the loaded ratio is (goal: at most 1.25x),
and, loaded, the first and the last (b) of the process against each other (repeated runs
in one process should cost the same).

    python benchmarks/shared_machine.py [--sequences 8] [--tokens 512] [--repeats 2] [--load 1]

Time it on an otherwise quiet machine: the quiet half must be quiet.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from timing import collapse_pair, timed

import probe
from probe.analyses import collapse
from probe.requests.inputs import make_inputs

BUSY = "while True: pass"


def measure(probed, inputs, batch: int, repeats: int) -> dict[str, list[float]]:
    """(a) and (b), interleaved ``repeats`` times: their seconds, in order."""
    forwards, analysis = collapse_pair(probed, inputs, batch)
    times: dict[str, list[float]] = {"forwards": [], "collapse.run": []}
    for _ in range(repeats):
        times["forwards"].append(timed(forwards, probed.device))
        times["collapse.run"].append(timed(analysis, probed.device))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--load", type=int, default=1, help="competing busy processes")
    args = parser.parse_args()
    probed = probe.load(args.model, init="random")
    inputs = make_inputs(probed.tokenizer, probed.config.vocab_size, sequences=args.sequences,
                         tokens=args.tokens, seed=0)  # fmt: skip
    # Warm-up on one sequence: nnsight's wrapper, allocators, lazy imports, the pools.
    collapse.run(probed, variants="all", init="random", sequences=1, tokens=args.tokens)
    quiet = measure(probed, inputs, args.batch_size, args.repeats)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.load)]
    try:
        loaded = measure(probed, inputs, args.batch_size, args.repeats)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    ratios = {}
    for name, times in (("quiet", quiet), ("loaded", loaded)):
        a, b = statistics.median(times["forwards"]), statistics.median(times["collapse.run"])
        ratios[name] = b / a
        print(f"{name:6s} forwards {a:7.2f} s  collapse.run {b:7.2f} s  ratio {b / a:.2f}x "
              f"(median of {args.repeats})", flush=True)  # fmt: skip
    first, last = loaded["collapse.run"][0], loaded["collapse.run"][-1]
    print(
        f"loaded against quiet: {ratios['loaded'] / ratios['quiet']:.2f}x worse (goal 1.25x); "
        f"loaded collapse.run first {first:.2f} s, last {last:.2f} s ({last / first:.2f}x); "
        f"{args.model} {args.sequences} x {args.tokens}, {args.load} busy process(es), "
        f"torch threads {__import__('torch').get_num_threads()}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}",
        flush=True,
    )


if __name__ == "__main__":
    main()
