"""Faults at the seams, at fixed points: a full or unwritable disk, signals, a closed stdout.

Each CLI case runs the real command (``tests/cli_process``) with a fault planted by a
``setup`` hook the child calls first (a function of this module): the write that fails,
the signal sent at a chosen moment.  Every case checks what a user sees (exit code, the
lines on stderr, never a traceback) and what is on disk (nothing half-written, no staging
left, what was there before untouched).  The disk itself fills for real in a small tmpfs
where the platform lets a test mount one (``unshare``), so HDF5 meets the full disk it
used to crash on.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests import cli_process
from tests.test_faults import INTERRUPTED, _written, check_folder, sandbox
from tests.test_fuzz_cli import snapshot

COUNT = ["paths", "--count", "--layers", "6", "--heads", "4", "--out", "out"]
NAME = re.compile(r"^result: (out/.+)\.nc$", re.M)
HERE = "tests.test_seams"


def _kill_self(*signums: int) -> None:
    for signum in signums:
        os.kill(os.getpid(), signum)


def _at_publish(*signums: int) -> None:
    """Send ``signums`` to this process the moment a unit of files is put in place."""
    from probe.cli import output

    original = output.wrote

    def wrote(*paths):
        original(*paths)
        _kill_self(*signums)

    output.wrote = wrote


# --- hooks: each plants one fault in the child (cli_process.start(setup=...)) -------------


def int_int_at_publish():
    _at_publish(signal.SIGINT, signal.SIGINT)


def term_term_at_publish():
    _at_publish(signal.SIGTERM, signal.SIGTERM)


def hup_at_publish():
    _at_publish(signal.SIGHUP)


def more_signals_while_stopping():
    """SIGINT as the result is published; then SIGINT and SIGTERM while the command says its
    line, and SIGINT again as the process exits."""
    import atexit

    from probe.cli import console

    _at_publish(signal.SIGINT)
    original = console.fail

    def fail(message, code=2):
        _kill_self(signal.SIGINT, signal.SIGTERM)
        original(message, code)

    console.fail = fail
    atexit.register(_kill_self, signal.SIGINT, signal.SIGTERM)


def signals_after_the_last_step():
    from probe.cli import console

    original = console.OneLineErrors.invoke

    def invoke(self, ctx):
        result = original(self, ctx)
        _kill_self(signal.SIGINT, signal.SIGTERM)
        return result

    console.OneLineErrors.invoke = invoke


def little_space():
    from probe.files import staging

    staging.free_space = lambda folder: 1000


def full_at_the_report():
    """The report's write fails halfway with ENOSPC (the result's staging is written)."""
    original = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if ".html." in self.name:
            original(self, data[: len(data) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self, data, *args, **kwargs)

    Path.write_text = write_text


def full_at_the_result():
    """The netCDF bytes' write fails halfway with ENOSPC."""
    import builtins

    from probe.files import results

    class Half:
        def __init__(self, path, mode):
            self.file = builtins.open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            self.file.write(bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    results.open = Half


def report_rename_refused():
    """Putting the report in place is refused (EPERM), after the result was put in place."""
    from probe.files import staging

    original = os.replace

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith(".html") and ".part" in str(src):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        return original(src, dst, *args, **kwargs)

    staging.os.replace = replace


def stdout_closed():
    read, write = os.pipe()
    os.close(read)
    os.dup2(write, 1)  # every write to stdout now fails with EPIPE, as under `| head -1`
    os.close(write)


def library_warnings():
    """Warnings of numpy (twice: two places), matplotlib and a deprecation, mid-command."""
    import warnings

    import numpy as np

    from probe.cli import output

    original = output.write_index

    def write_index(out_dir):
        with np.errstate(divide="warn", invalid="warn"):
            np.divide(np.ones(1), np.zeros(1))
            np.log(-np.ones(1))
        warnings.warn("Glyph 1 missing from font", UserWarning, stacklevel=1)
        warnings.warn("old api", DeprecationWarning, stacklevel=1)
        return original(out_dir)

    output.write_index = write_index


def cwd_deleted():
    gone = tempfile.mkdtemp()
    os.chdir(gone)
    os.rmdir(gone)


# --- the cases -----------------------------------------------------------------------------


def _run(world, tmp_path, setup=None, args=COUNT, box=None, name="run"):
    box = box or sandbox(world, tmp_path)
    before = snapshot(box)
    run = cli_process.start(
        args, box, tmp_path / "logs", name, setup=f"{HERE}:{setup}" if setup else None
    )
    code = run.wait()
    err = run.err()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return box, before, run, code, err.splitlines()


SIGNALS = [  # hook, exit code
    ("int_int_at_publish", 130),
    ("term_term_at_publish", 143),
    ("hup_at_publish", 129),
    ("more_signals_while_stopping", 130),
]


@pytest.mark.parametrize(("hook", "code"), SIGNALS, ids=[h for h, _ in SIGNALS])
def test_signals_at_publish_give_one_line_once(hook, code, world, tmp_path):
    box, before, run, got, lines = _run(world, tmp_path, hook)
    assert got == code, lines
    assert len(lines) == 1 and INTERRUPTED.match(lines[0]), lines
    named = _written(lines[0], box)
    assert len(named) == 2 and named[0].endswith(".nc") and named[1].endswith(".html"), named
    changed = {k for k in snapshot(box) if snapshot(box).get(k) != before.get(k)}
    assert changed == {"out", *named}, changed  # the pair, in its new folder; no index
    check_folder(box, hook)


def test_a_signal_after_the_last_step_exits_0_and_says_what_was_written(world, tmp_path):
    box, before, run, code, lines = _run(world, tmp_path, "signals_after_the_last_step")
    assert code == 0, lines
    assert len(lines) == 1, lines
    prefix = "probe: interrupted after the command had finished; it wrote: "
    assert lines[0].startswith(prefix), lines
    named = lines[0].removeprefix(prefix).split(", ")
    assert len(named) == 3 and named[2] == "out/index.html", named
    assert sorted(named) == sorted(k for k in snapshot(box) if k.startswith("out/")), named
    check_folder(box, "after the last step")


def _first_run(world, tmp_path):
    """A good run into out/, and the name of its result (without .nc)."""
    box, _, run, code, _ = _run(world, tmp_path, name="first")
    assert code == 0
    return box, NAME.search(run.out()).group(1)


WRITE_FAULTS = [  # hook, what the one line says, whether an earlier result is there
    ("little_space", r"not enough space in out: the results and their reports need about "
     r"2\.0 MiB, 1000 bytes free; free some space or write elsewhere", False),
    ("full_at_the_report", r"cannot write out/.+\.html: No space left on device \(.+ free in "
     r"out\); it was not written", False),
    ("full_at_the_result", r"cannot write out/.+\.nc: No space left on device \(.+ free in "
     r"out\); it was not written", False),
    ("report_rename_refused", r"cannot write out/.+\.html: Operation not permitted; it was "
     r"not written", True),
    ("full_at_the_report", r"cannot write out/.+\.html: No space left on device \(.+ free in "
     r"out\); it was not written", True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("hook", "line", "earlier"), WRITE_FAULTS, ids=[f"{h}-{e}" for h, _, e in WRITE_FAULTS]
)
def test_a_failed_write_is_one_line_and_leaves_what_was_there(hook, line, earlier, world, tmp_path):
    box = _first_run(world, tmp_path)[0] if earlier else None
    box, before, run, code, lines = _run(world, tmp_path, hook, box=box)
    assert code == 2, lines
    assert len(lines) == 1 and re.fullmatch("probe: error: " + line, lines[0]), lines
    assert snapshot(box) == before  # an earlier result and report untouched, nothing new
    check_folder(box, hook)


def test_a_folder_in_the_way_of_the_report(world, tmp_path):
    box, name = _first_run(world, tmp_path)
    shutil.rmtree(box / "out")
    (box / f"{name}.html").mkdir(parents=True)
    box, before, run, code, lines = _run(world, tmp_path, box=box)
    assert code == 2 and lines == [
        f"probe: error: cannot write {name}.html: a folder is in the way; it was not written"
    ], lines
    assert snapshot(box) == before
    check_folder(box, "folder in the way")


def test_an_immutable_report_in_the_way(world, tmp_path):
    box, name = _first_run(world, tmp_path)
    report = box / f"{name}.html"
    if subprocess.run(["chattr", "+i", str(report)], capture_output=True).returncode != 0:
        pytest.skip("no chattr +i here (not root, or a file system without the flag)")
    try:
        box, before, run, code, lines = _run(world, tmp_path, box=box)
    finally:
        subprocess.run(["chattr", "-i", str(report)], check=True)
    assert code == 2 and lines == [
        f"probe: error: cannot write {name}.html: Operation not permitted; it was not written"
    ], lines
    assert snapshot(box) == before
    check_folder(box, "immutable report")


def test_a_closed_stdout_drops_lines_not_work(world, tmp_path):
    box, before, run, code, lines = _run(world, tmp_path, "stdout_closed")
    assert code == 0, lines
    assert lines == [
        "probe: warning: standard output was closed before the command ended; "
        "the rest of its lines were dropped, the command went on"
    ]
    new = sorted(k for k in snapshot(box) if k not in before)
    assert sorted(Path(k).suffix for k in new) == ["", ".html", ".html", ".nc"], new  # out/, all
    check_folder(box, "stdout closed")


def test_library_warnings_become_one_note_or_nothing(world, tmp_path):
    box, before, run, code, lines = _run(world, tmp_path, "library_warnings")
    assert code == 0
    assert lines == [
        "probe: warning: a computation gave NaN or infinite values (divide by zero "
        "encountered in divide, in test_seams.py); the numbers it touched are NaN or "
        "infinite in the result"
    ]
    check_folder(box, "warnings")


def test_a_deleted_current_folder_is_one_line(world, tmp_path):
    box, before, run, code, lines = _run(world, tmp_path, "cwd_deleted")
    assert code == 2
    assert lines == [
        "probe: error: the current folder is gone (No such file or directory); "
        "cd to an existing folder"
    ]
    assert snapshot(box) == before


# --- a real full disk: a tmpfs in a mount namespace of its own --------------------------

FULL_DISK = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, xarray as xr
    from probe.errors import ProbeError
    from probe.files.results import save_result
    from probe.files.stream import SequenceWriter

    folder, said = sys.argv[1], {}
    big = xr.Dataset({"x": (("a", "b"), np.random.default_rng(0).random((400, 400)))},
                     attrs={"analysis": "collapse"})  # 1.2 MiB in a 512 KiB file system
    try:
        save_result(big, os.path.join(folder, "r.nc"))
    except ProbeError as err:
        said["save"] = str(err)
    skeleton = xr.Dataset({"m": (("layer", "sequence"), np.zeros((50, 0)))},
                          coords={"sequence": np.arange(0)})
    try:
        with SequenceWriter(os.path.join(folder, "s.nc"), skeleton) as writer:
            for _ in range(1000):
                writer.append({"m": np.random.default_rng(1).random((50, 64))})
    except ProbeError as err:
        said["stream"] = str(err)
    said["left"] = sorted(os.listdir(folder))
    print(json.dumps(said))
    """
)


def test_a_full_disk_is_one_error_hdf5_never_sees(tmp_path):
    """On a full tmpfs HDF5 used to print a traceback per object it freed and abort (134)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    folder = tmp_path / "small"
    folder.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    mount = f"mount -t tmpfs -o size=512k tmpfs {folder}"
    done = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            f'{mount} && exec "$0" "$@"',
            sys.executable,
            str(script),
            str(folder),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    said = json.loads(done.stdout)
    nospace = r"\(.+ free in .+\); it was not written"
    assert re.fullmatch(rf"cannot write .+/r\.nc: No space left on device {nospace}", said["save"])
    assert re.fullmatch(
        rf"cannot write .+/s\.nc: No space left on device {nospace}", said["stream"]
    )
    assert said["left"] == []


def test_an_unwritable_home_leaves_matplotlib_silent(tmp_path):
    """HOME a file (no configuration folder can be made under it, even by root): matplotlib
    would say so on stderr; the entry point gives it a private folder first."""
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    code = (
        "from probe.cli.entry import writable_matplotlib_config as w; w(); "
        "import os, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; "
        "plt.figure(); plt.plot([1, 2]); print(os.environ['MPLCONFIGDIR'])"
    )
    env = {**os.environ, "HOME": str(home)}
    for name in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert Path(done.stdout.strip()).name.startswith("probe-matplotlib-")
    assert not Path(done.stdout.strip()).exists()  # removed at exit
