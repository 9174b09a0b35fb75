"""Faults, table-driven: signals at random points, kill -9 then a rerun, concurrent runs.

Every command that writes is in ``WRITERS`` with a command line on tiny inputs from
``tests/cli_world``.  Each case runs the real command in a process of its own
(``tests/cli_process``: forked from a server that has imported probe) in a private copy
of the world, and checks what is on disk afterwards:

* **a signal at a random point** (SIGINT or SIGTERM, after a random delay): the command
  ends with 0 (it had finished) or 130/143 and one ``probe: error: interrupted; ...``
  line that names exactly the files and folders it put in place, which are all that
  changed; no traceback, no staging or temporary file left, no result without its report;
* **kill -9 at a random point, then the same command again**: the rerun succeeds, and
  what the killed run was writing (staging of a dead process) is gone;
* **three runs at once into one folder**: all succeed and leave one consistent set:
  every result with its report, the index listing them, a checkpoint and its report
  and its baseline from one and the same run.

The random points come from ``PROBE_FAULT_SEED`` (default: a fixed seed, printed on
failure).  ``make test`` runs one signal per command, kill -9 for ``fastformer train``
and ``collapse``, and concurrency for ``fastformer train`` and ``collapse``; the whole
matrix runs with ``PROBE_SLOW=1``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

from tests import cli_process
from tests.cli_world import copy_world
from tests.test_fuzz_cli import LEFTOVER, snapshot

SEED = int(os.environ.get("PROBE_FAULT_SEED", "18"))
SLOW = os.environ.get("PROBE_SLOW", "0") not in ("", "0")

TRAIN = ["fastformer", "train", "--text", "texts/good.txt", "--hidden", "8", "--heads", "2",
         "--layers", "2", "--context", "16", "--batch", "2", "--steps", "30", "--eval-every", "10",
         "--baseline", "gpt2"]  # fmt: skip
#: name -> (command line, seconds within which a signal lands at a random point)
WRITERS: dict[str, tuple[list[str], float]] = {
    "collapse": (["collapse", "models/tiny-bert", "models/tiny-gpt2", "--init", "random",
                  "--sequences", "4", "--tokens", "8", "--batch-size", "2", "--out", "out"], 10),
    "paths --count": (["paths", "--count", "--layers", "6", "--heads", "4", "--out", "out"], 6),
    "paths --sample": (["paths", "--sample", "models/tiny-bert", "--init", "random",
                        "--samples", "8", "--sequences", "4", "--tokens", "8", "--out", "out"], 8),
    "paths --decompose": (["paths", "--decompose", "models/tiny-gpt2", "--init", "random",
                           "--sequences", "2", "--tokens", "6", "--out", "out"], 8),
    "toy": (["toy", "circle", "--quick", "--epochs", "3", "--steps", "6", "--out", "out"], 10),
    "fastformer train": ([*TRAIN, "--out", "ff"], 15),
    "fastformer report": (["fastformer", "report", "trained/fastformer-tiny",
                           "trained/gpt2-tiny", "--out", "out"], 6),
    "compare": (["compare", "results/collapse.nc", "results/collapse-other.nc",
                 "--out", "out"], 8),
    "report build": (["report", "build", "results/collapse.nc", "results/paths-count.nc",
                      "--out", "out"], 8),
}  # fmt: skip
INTERRUPTED = re.compile(
    r"^probe: error: interrupted; (nothing was written|written before the interrupt: (.+); "
    r"nothing else was written)$"
)


def sandbox(world, tmp_path: Path, name: str = "box") -> Path:
    box = tmp_path / name
    box.mkdir()
    copy_world(world[0], box)
    return box


def changes(before: dict, after: dict) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def check_folder(box: Path, context: str) -> None:
    """Nothing half-written: no staging left, every result beside its report."""
    state = snapshot(box)
    leftovers = [k for k in state if LEFTOVER.search(Path(k).name)]
    assert not leftovers, f"left {leftovers}; {context}"
    for name in state:
        if name.endswith(".nc") and not name.startswith(("results/", "trained/")):
            assert name[:-3] + ".html" in state, f"{name} without its report; {context}"


def wait_started(run: cli_process.Run, timeout: float = 60) -> None:
    """Until the child has handed its output to the command (its stderr file exists)."""
    end = time.monotonic() + timeout
    while not run.stderr.exists():
        assert time.monotonic() < end, "the child never started"
        time.sleep(0.005)


def _written(line: str, box: Path) -> list[str]:
    """The paths an interrupt line names, relative to the sandbox."""
    match = INTERRUPTED.match(line)
    assert match, line
    if match.group(2) is None:
        return []
    return [os.path.relpath(box / p.strip(), box) for p in match.group(2).split(", ")]


def check_interrupted(run, code: int, before: dict, box: Path, context: str) -> None:
    err = run.err()
    assert "Traceback" not in err and "Traceback" not in run.out(), context + err
    after = snapshot(box)
    changed = changes(before, after)
    if code == 0:  # the command had finished before the signal came
        check_folder(box, context)
        return
    assert code in (130, 143), f"exit {code}; {context}\n{err}"
    lines = err.splitlines()
    assert lines and INTERRUPTED.match(lines[-1]), f"{context}\n{err}"
    named = _written(lines[-1], box)
    for path in named:
        assert path in after, f"named {path}, which is not there; {context}"
    outside = [c for c in changed if not any(c == n or c.startswith(n + "/") for n in named)]
    # A folder the unit's files went into may be new too (out/), never anything else.
    outside = [c for c in outside if not any(n.startswith(c + "/") for n in named)]
    assert not outside, f"changed {outside} but named only {named}; {context}\n{err}"
    check_folder(box, context)


def _signal_case(name: str, signum: int, delay_seed: int, world, tmp_path: Path) -> None:
    args, span = WRITERS[name]
    rng = random.Random(delay_seed)
    delay = rng.uniform(0, span)
    box = sandbox(world, tmp_path)
    before = snapshot(box)
    run = cli_process.start(args, box, tmp_path / "logs")
    wait_started(run)
    time.sleep(delay)
    if run.process.exitcode is None:
        os.kill(run.pid, signum)
    code = run.wait()
    context = f"{name}: {signal.Signals(signum).name} after {delay:.2f} s (PROBE_FAULT_SEED={SEED})"
    check_interrupted(run, code, before, box, context)


def _signal_cases():
    rng = random.Random(SEED)
    cases = []
    for name in WRITERS:
        for signum in (signal.SIGINT, signal.SIGTERM) if SLOW else (rng.choice([2, 15]),):
            cases.append((name, int(signum), rng.randrange(2**32)))
    return cases


@pytest.mark.parametrize(
    ("name", "signum", "delay_seed"),
    _signal_cases(),
    ids=[f"{n}-{signal.Signals(s).name}" for n, s, _ in _signal_cases()],
)
def test_a_signal_at_a_random_point(name, signum, delay_seed, world, tmp_path):
    _signal_case(name, signum, delay_seed, world, tmp_path)


KILLED = list(WRITERS) if SLOW else ["fastformer train", "collapse"]


@pytest.mark.parametrize("name", KILLED)
def test_kill_9_then_the_same_command_again(name, world, tmp_path):
    args, span = WRITERS[name]
    rng = random.Random(f"{SEED}-{name}")
    delay = rng.uniform(0.2 * span, span)
    box = sandbox(world, tmp_path)
    run = cli_process.start(args, box, tmp_path / "logs", "killed")
    wait_started(run)
    time.sleep(delay)
    if run.process.exitcode is None:
        os.kill(run.pid, signal.SIGKILL)
    run.wait()
    context = f"{name}: kill -9 after {delay:.2f} s (PROBE_FAULT_SEED={SEED})"
    again = cli_process.start(args, box, tmp_path / "logs", "again")
    code = again.wait()
    assert code == 0, f"{context}: the rerun failed\n{again.err()}"
    check_folder(box, context)


CONCURRENT = list(WRITERS) if SLOW else ["fastformer train", "collapse"]


def _seeded(args: list[str], seed: int) -> list[str]:
    """The same command with its own seed where it takes one (so runs differ)."""
    if args[0] in ("collapse", "fastformer", "toy") or args[:2] == ["paths", "--sample"]:
        return [*args, "--seed", str(seed)]
    return args


@pytest.mark.parametrize("name", CONCURRENT)
def test_three_runs_at_once_into_one_folder(name, world, tmp_path):
    args, _ = WRITERS[name]
    box = sandbox(world, tmp_path)
    runs = [
        cli_process.start(_seeded(args, seed), box, tmp_path / "logs", f"run{seed}")
        for seed in (1, 2, 3)
    ]
    codes = [run.wait() for run in runs]
    for run, code in zip(runs, codes, strict=True):
        assert code == 0, f"{name}: {run.err()}"
        assert "Traceback" not in run.err()
    check_folder(box, name)
    if name == "fastformer train":
        # One run's checkpoint, its report and its baseline: never a mix of seeds.
        ours = json.loads((box / "ff" / "training.json").read_text())
        theirs = json.loads((box / "ff-gpt2" / "training.json").read_text())
        assert ours["settings"]["seed"] == theirs["settings"]["seed"]
        from probe.files.results import open_result

        report = open_result(box / "ff" / "training.nc")
        assert json.loads(report.attrs["settings"])["seed"] == ours["settings"]["seed"]
    out = box / "out"
    if out.is_dir() and (out / "index.html").exists():
        from probe.reports import index_entries

        listed = {e["file"] for e in index_entries(out)}
        pages = {p.name for p in out.glob("*.html") if p.name != "index.html"}
        assert listed == pages, f"the index lists {listed}, the folder holds {pages}"


def _started(pid: int, timeout: float = 60) -> bool:
    """Until probe's first code runs in ``pid``: its entry point catches SIGTERM (Python
    itself does not), which /proc/PID/status shows in SigCgt.  False without /proc."""
    status = Path(f"/proc/{pid}/status")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            return False
        if int(fields["SigCgt"].strip(), 16) & (1 << (signal.SIGTERM - 1)):
            return True
        time.sleep(0.002)
    return False


def test_early_interrupt_is_one_line(tmp_path):
    """Ctrl-C while the executable is still importing (its first 0.4 s): one line, 130.

    Delays count from the moment probe's own first code runs (``cli.entry``); a signal
    during the interpreter's start-up before that (site, .pth files) is Python's to
    handle, not probe's.
    """
    probe = Path(sys.executable).with_name("probe")
    if not probe.exists() or not Path("/proc/self/status").exists():
        pytest.skip("no installed probe executable next to this Python, or no /proc")
    rng = random.Random(SEED)
    for delay in [0.0, 0.05, 0.1, 0.2, 0.3] + [rng.uniform(0, 0.4) for _ in range(2)]:
        proc = subprocess.Popen(
            [str(probe), "paths", "--count", "--out", str(tmp_path / "out")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert _started(proc.pid), "probe's entry point never ran"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        context = f"SIGINT {delay:.2f} s after start: exit {proc.returncode}\n{err}"
        assert "Traceback" not in err, context
        if proc.returncode == 0:  # it finished first
            continue
        assert proc.returncode == 130, context
        lines = err.strip().splitlines()
        assert len(lines) == 1 and INTERRUPTED.match(lines[-1]), context
        shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_a_signal_in_a_weakset_callback_waits_for_a_safe_point():
    """A signal landing in WeakSet's weakref callback (an object of a WeakSet collected) is
    recorded, not raised there, where Python would print it and drop it; check_interrupt
    raises it."""
    from probe.files import interrupts

    class Item:
        pass

    frames = []

    def spy(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith("_weakrefset.py"):
            frames.append(frame)

    members, item = weakref.WeakSet(), Item()
    members.add(item)
    sys.setprofile(spy)
    try:
        del item  # WeakSet's _remove runs as the weakref callback
    finally:
        sys.setprofile(None)
    assert frames and frames[0].f_code.co_name == "_remove"
    try:
        interrupts.record(signal.SIGTERM, frames[0])  # recorded, not raised
        with pytest.raises(interrupts.Interrupted) as raised:
            interrupts.check_interrupt()
        assert raised.value.code == 143
    finally:
        interrupts.clear()


def test_the_handler_only_records_and_safe_points_raise():
    """Under ``handled`` a real signal raises nothing where it lands; the next
    check_interrupt raises it with its exit code, and so does the next call of a torch
    module once ``check_at_module_calls`` is on; leaving the block sets the handlers back
    and forgets a signal never raised."""
    import torch

    from probe.files import interrupts

    before = signal.getsignal(signal.SIGINT)
    with interrupts.handled():
        interrupts.check_interrupt()  # nothing recorded: nothing raised
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler has run (it runs between bytecodes) and raised nothing
            pass
        with pytest.raises(interrupts.Interrupted) as raised:
            interrupts.check_interrupt()
        assert raised.value.code == 130
        interrupts.check_at_module_calls()
        with pytest.raises(interrupts.Interrupted):
            torch.nn.Identity()(torch.zeros(1))
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    assert signal.getsignal(signal.SIGINT) is before
    interrupts.check_interrupt()  # the SIGTERM never raised is forgotten
    torch.nn.Identity()(torch.zeros(1))
