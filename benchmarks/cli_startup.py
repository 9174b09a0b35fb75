"""Start-up time of the ``probe`` command, against a bare Python start.

Runs, interleaved, (a) ``python -c pass`` and (b) ``probe --help`` / ``probe
--version`` through the installed entry point, and prints the median wall
times and (b) - (a), the time probe itself adds.  Goal: ``probe --help`` under
0.5 s in all (heavy modules such as torch, seaborn and scipy are imported only
inside the commands that need them).

    python benchmarks/cli_startup.py [--repeats 11]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    entry = shutil.which("probe") or str(Path(sys.executable).with_name("probe"))
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "probe --help": [entry, "--help"],
        "probe --version": [entry, "--version"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():
            times[name].append(timed(command))
    base = statistics.median(times["python -c pass"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:16s} median {median:6.3f} s   probe's own part {median - base:6.3f} s")
    help_time = statistics.median(times["probe --help"])
    print(
        f"probe --help: {help_time:.3f} s (goal: under 0.5 s) -> {'met' if help_time < 0.5 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
