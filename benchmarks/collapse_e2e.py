"""End to end: the whole collapse analysis against the forward passes it needs.

For each size, a random-init model is loaded once; then, interleaved ``--repeats`` times,

  (a) the forwards: every batch of the analysis under each of the four ablations (SAN,
      SAN+MLP, SAN+skip, transformer) through ``probe.surgery.trace.layer_values`` with the trivial
      reduction, so the residual stream X_0 .. X_L is captured and nothing else is computed;
  (b) the analysis: ``collapse.run`` on the preloaded model (same inputs, same batches, all
      four variants, all metrics), Dataset included;

and, with ``--cli``,

  (c) the command itself, ``probe collapse MODEL --init random`` with the same settings, in a
      fresh process (start-up, model construction, result, report and index included);

and the medians, the ratios (b)/(a) and (c)/(a), the command's fixed cost (c) - (b) and the
peak memory are printed: on a CPU the benchmark process's peak resident set so far (it only
grows, so run one size per process to compare sizes) and the command's own peak, on CUDA the
peak allocated by (b).  Goals: (b) at most 1.3x (a) at every size on a CPU with the
default metrics; the command at 32 x 128 at most 1.5x, its fixed cost at most 3 s.

``--cli`` also prints the command's fixed cost beyond its libraries' import floor:
``probe collapse bert-base-uncased --init random --sequences 2 --tokens 16`` against
``python -c "import torch, transformers, nnsight, xarray, matplotlib.pyplot; from transformers
import BertModel"``, both fresh processes, interleaved ``--repeats`` times, in wall time and
in CPU time (user + system: on a shared machine the wall time mostly measures the other
jobs); and each part of that command, timed inside its own process by
``command_parts.py`` (the floor's imports, probe's, the model's build with the random
init's draws, the self-test, the theory constants, the forwards and metrics, the report,
the writes, the index and the rest), with the command beyond the floor less the draws and
the constants, whose goal is at most 1.0 s.

The Llama size builds the shipped Llama-3.2-1B config (hidden 2048, 16 layers) at random init;
where probe.load cannot build it, it prints one line saying it is skipped.

    python benchmarks/collapse_e2e.py [--sizes bert-32x128,bert-128x512,gpt2-32x1024,llama-8x2048]
                                      [--device cpu,cuda] [--repeats 3] [--batch-size 16]
                                      [--metrics all] [--cli]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from timing import collapse_pair, timed

import probe
from probe.analyses import collapse
from probe.requests.inputs import make_inputs
from probe.surgery.ablate import PRESETS
from probe.surgery.trace import capture, layer_values

SIZES = {
    # tiny sizes: benchmarks/gpu.sh --device cpu runs them to check the script itself
    "bert-2x16": ("bert-base-uncased", 2, 16),
    "gpt2-2x32": ("gpt2", 2, 32),
    "bert-32x128": ("bert-base-uncased", 32, 128),
    "bert-128x512": ("bert-base-uncased", 128, 512),
    "gpt2-32x1024": ("gpt2", 32, 1024),
    "llama-8x2048": ("meta-llama/Llama-3.2-1B", 8, 2048),
}


def bench(
    model: str,
    sequences: int,
    tokens: int,
    device: str,
    repeats: int,
    batch: int,
    cli: bool,
    chosen: str = "all",
    dtype: str = "float32",
    profile: bool = False,
):
    try:
        probed = probe.load(model, init="random", device=device, dtype=dtype)
    except probe.ProbeError as err:
        return f"skipped: {err}"
    peaks = {"command": 0}
    # The very inputs and batches collapse.run makes for these settings.
    inputs = make_inputs(
        probed.tokenizer, probed.config.vocab_size, sequences=sequences, tokens=tokens, seed=0
    )
    forwards, analysis = collapse_pair(probed, inputs, batch, chosen)

    def command():
        # The whole job as a user runs it: a fresh process that builds the model, probes it,
        # writes the result, its report and the index.
        # The installed entry point, as a user types it (``python -m`` would import what the
        # library registers for notebooks).
        probe_command = os.path.join(os.path.dirname(sys.executable), "probe")
        with tempfile.TemporaryDirectory() as out:
            child = subprocess.Popen(
                [probe_command, "collapse", model, "--init", "random",
                 "--sequences", str(sequences), "--tokens", str(tokens), "--seed", "0",
                 "--batch-size", str(batch), "--device", device, "--metrics", chosen,
                 "--dtype", dtype,
                 "--quiet", "--out", out],
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode:
                raise SystemExit(f"probe collapse failed with exit code {child.returncode}")
            peaks["command"] = max(peaks["command"], usage.ru_maxrss * 1024)

    runs = {"(a) forwards": forwards, "(b) collapse.run": analysis}
    if cli:
        runs["(c) probe collapse"] = command
    # Warm-up on one sequence (nnsight's wrapper, allocators, lazy imports, the LAPACK pool):
    # the same code paths, without adding a whole batch's run to the large sizes (8 x 2048
    # is one batch).
    _, ids, mask = next(iter(inputs.batches(batch)))
    layer_values(probed, ids[:1], PRESETS["SAN"], capture, mask[:1])
    collapse.run(probed, variants="all", init="random", sequences=1, tokens=tokens)
    times = {name: [] for name in runs}
    if probed.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(probed.device)
    for _ in range(repeats):
        for name, fn in runs.items():
            times[name].append(timed(fn, probed.device))
    medians = {name: statistics.median(values) for name, values in times.items()}
    if probed.device.type == "cuda":
        medians["peak"] = f"peak {torch.cuda.max_memory_allocated(probed.device) / 2**30:.1f} GiB"
        if profile:
            try:
                medians["gpu"] = gpu_profile(analysis, probed.device)
            except Exception as err:  # the timings above stand without it
                medians["gpu"] = f"profile failed: {type(err).__name__}: {err}"[:300]
    else:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
        medians["peak"] = f"peak RSS {own:.1f} GiB" + (
            f", command {peaks['command'] / 2**30:.1f} GiB" if cli else ""
        )
    return medians


#: What every collapse command imports before probe does anything of its own.
IMPORT_FLOOR = (
    "import torch, transformers, nnsight, xarray, matplotlib.pyplot; "
    "from transformers import BertModel"
)


def fixed_cost(repeats: int) -> dict[str, tuple[float, float]]:
    """Medians of (wall, CPU) seconds of the smallest bert-base command and of the import
    floor, in fresh processes.  CPU is the child's user + system time (``os.wait4``): on a
    machine other jobs share, wall time mostly measures them, CPU time mostly this work."""
    probe_command = os.path.join(os.path.dirname(sys.executable), "probe")
    times: dict[str, list[tuple[float, float]]] = {"command": [], "floor": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            for name, argv in (
                ("command", [probe_command, "collapse", "bert-base-uncased", "--init", "random",
                             "--sequences", "2", "--tokens", "16", "--quiet", "--out", out]),
                ("floor", [sys.executable, "-c", IMPORT_FLOOR]),
            ):  # fmt: skip
                start = time.perf_counter()
                child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
                _, status, usage = os.wait4(child.pid, 0)
                wall = time.perf_counter() - start
                if code := os.waitstatus_to_exitcode(status):
                    raise SystemExit(f"{' '.join(argv[:3])} failed with exit code {code}")
                times[name].append((wall, usage.ru_utime + usage.ru_stime))
    return {
        name: tuple(statistics.median(run[i] for run in runs) for i in (0, 1))
        for name, runs in times.items()
    }


#: The part of the command that its goal leaves out: the analysis's own draws and constants.
ANALYSIS_PARTS = ("model build at random init (the draws)", "theory constants")


def command_parts(repeats: int) -> dict[str, float]:
    """Medians of the parts of the smallest bert-base command, each timed inside its own
    fresh process by ``command_parts.py`` (the floor, probe's imports, each function of
    its ``PARTS``, the rest), over ``repeats`` processes."""
    here = os.path.dirname(os.path.abspath(__file__))
    found: list[dict[str, float]] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            record = os.path.join(out, "parts.json")
            subprocess.run(
                [sys.executable, os.path.join(here, "command_parts.py"), record, "collapse",
                 "bert-base-uncased", "--init", "random", "--sequences", "2", "--tokens", "16",
                 "--quiet", "--out", out],
                stdout=subprocess.DEVNULL, check=True,
            )  # fmt: skip
            with open(record, encoding="utf-8") as handle:
                one = json.load(handle)
        if one.pop("exit"):
            raise SystemExit("probe collapse failed inside command_parts.py")
        measured = sum(v for k, v in one.items() if k not in ("floor", "total"))
        one["the rest"] = one["total"] - one["floor"] - measured
        found.append(one)
    names = dict.fromkeys(name for one in found for name in one)
    return {name: statistics.median(one.get(name, 0.0) for one in found) for name in names}


def gpu_profile(run, device: torch.device) -> str:
    """The GPU's idle share during ``run()`` (torch profiler, GPU activity only) and where
    the host waited for the device (CUDA's sync debug mode, by thread and line).

    Idle share: 1 - (time some kernel or copy ran) / (first to last GPU activity of the
    run).  The sync count names the Python lines that made the host wait; the main thread's
    are the ones inside the layer loop (the metrics worker waits on purpose, once a batch)."""
    import collections
    import threading
    import warnings

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    torch.cuda.synchronize(device)
    with profiler(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize(device)
    spans = sorted(
        (event.time_range.start, event.time_range.end)
        for event in prof.events()
        if getattr(event.device_type, "name", "") == "CUDA" and event.time_range.end > 0
    )
    busy, reach = 0.0, None
    for start, end in spans:  # the union of the intervals
        if reach is None or start > reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    window = spans[-1][1] - spans[0][0] if spans else 0.0
    idle = f"{1 - busy / window:.0%}" if window > 0 else "n/a"
    waits: collections.Counter = collections.Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message):
                thread = threading.current_thread().name.split("_")[0]
                waits[f"{thread} {os.path.basename(filename)}:{lineno}"] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = shown
    main = collections.Counter({w: n for w, n in waits.items() if w.startswith("MainThread")})
    rest = waits - main
    top = "; ".join(
        f"{', '.join(f'{where} x{count}' for where, count in counter.most_common(3))}"
        for counter in (main, rest)
        if counter
    )
    return (
        f"GPU idle {idle} of {window / 1e3:.0f} ms; host waits: {main.total()} on the main "
        f"thread, {rest.total()} elsewhere" + (f" ({top})" if top else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"from {', '.join(SIZES)}")
    default_devices = "cpu,cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_devices, help="comma list: cpu, cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--metrics", default="all", help="what --metrics the runs use")
    parser.add_argument("--dtype", default="float32", help="comma list: float32, bfloat16, ...")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="on CUDA, also the GPU's idle share and the host's waits in one collapse.run",
    )
    parser.add_argument(
        "--cli", action="store_true", help="also time `probe collapse` itself, in a fresh process"
    )
    args = parser.parse_args()
    sizes = [name.strip() for name in args.sizes.split(",") if name.strip()]
    unknown = [name for name in sizes if name not in SIZES]
    if unknown:
        parser.error(f"unknown size {', '.join(unknown)}; choose from {', '.join(SIZES)}")

    if args.cli:
        found = fixed_cost(args.repeats)
        (job, job_cpu), (floor, floor_cpu) = found["command"], found["floor"]
        print(
            f"fixed cost  probe collapse bert-base 2 x 16 {job:.2f} s, import floor {floor:.2f} s, "
            f"beyond the floor {job - floor:.2f} s; CPU time {job_cpu:.2f} s, floor "
            f"{floor_cpu:.2f} s, beyond {job_cpu - floor_cpu:.2f} s (median of {args.repeats}, "
            f"load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
        parts = command_parts(args.repeats)
        beyond = parts["total"] - parts["floor"]
        rest = beyond - sum(parts.get(name, 0.0) for name in ANALYSIS_PARTS)
        for name, seconds in parts.items():
            if name not in ("floor", "total"):
                print(f"  part  {name:40s} {seconds:6.2f} s", flush=True)
        print(
            f"  parts probe collapse bert-base 2 x 16 {parts['total']:.2f} s, floor "
            f"{parts['floor']:.2f} s (in-process), beyond {beyond:.2f} s; less the draws and "
            f"the constants {rest:.2f} s (goal 1.0 s; median of {args.repeats} processes, "
            f"each part's own median)",
            flush=True,
        )
    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    for device, dtype, name in (
        (device, dtype, name)
        for device in [d.strip() for d in args.device.split(",") if d.strip()]
        for name in sizes
        for dtype in dtypes
    ):
        model, sequences, tokens = SIZES[name]
        where = f"{name:13s} {device:5s} {dtype:8s}"
        medians = bench(
            model,
            sequences,
            tokens,
            device,
            args.repeats,
            args.batch_size,
            args.cli,
            args.metrics,
            dtype,
            args.profile,
        )
        if device.startswith("cuda"):  # the last size's model off the card before the next
            gc.collect()
            torch.cuda.empty_cache()
        if isinstance(medians, str):
            print(f"{where} {medians}", flush=True)
            continue
        forwards, analysis = medians["(a) forwards"], medians["(b) collapse.run"]
        line = (
            f"{where} forwards {forwards:8.3f} s  collapse.run "
            f"{analysis:8.3f} s  ratio {analysis / forwards:.2f}x"
        )
        if args.cli:
            job = medians["(c) probe collapse"]
            line += (
                f"  probe collapse {job:8.2f} s  ratio {job / forwards:.2f}x"
                f"  fixed cost {job - analysis:.2f} s"
            )
        load = os.getloadavg()[0]
        print(
            f"{line}  {medians['peak']}  (median of {args.repeats}, batch "
            f"{args.batch_size}, load average {load:.1f})"
            + (f"\n{'':13s} {medians['gpu']}" if "gpu" in medians else ""),
            flush=True,
        )


if __name__ == "__main__":
    main()
