"""The real ``probe`` command in a process of its own, started in milliseconds.

Fault tests need whole processes (a signal goes to a process, ``kill -9`` ends one,
concurrent runs are several), but a fresh interpreter spends seconds importing torch.
Children here are forked from multiprocessing's fork server, which has imported probe
once and holds no threads: each child runs ``probe.cli.entry.main`` (the console
script's function) with its own argv, working folder, stdout and stderr files, exactly
as the installed ``probe`` executable does after its imports.  Python's own start-up is
tested separately, on the real executable (``test_faults.test_early_interrupt``).

A torchrun job cannot be forked so: torchrun starts its ranks as interpreters of their own.
``launch`` runs the command, under torchrun or alone, in a fresh ``python -m probe.cli``.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PRELOAD = [
    "probe.cli.entry",
    "probe.cli.app",
    "probe.cli.collapse_run",
    "probe.cli.output",
    "probe.analyses.collapse",
    "probe.analyses.paths",
    "probe.analyses.toy",
    "probe.fastformer.train",
    "probe.reports",
    "probe.reports.training",
]

_context = None


def context():
    """The fork-server context, started once per test session (its imports take seconds)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _main(args: list[str], cwd: str, stdout: str, stderr: str, setup: str | None = None) -> None:
    os.chdir(cwd)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["probe", *args]
    if setup is not None:  # "module:function", run in the child first (a fault at a fixed point)
        import importlib

        module, function = setup.split(":")
        getattr(importlib.import_module(module), function)()
    from probe.cli.entry import main

    main()


@dataclass
class Run:
    """One running ``probe`` command."""

    process: multiprocessing.Process
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float = 600) -> int:
        """The exit code: the command's, or -N for a process ended by signal N."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            raise TimeoutError(f"probe {self.process.name} still ran after {timeout} s")
        return self.process.exitcode

    def out(self) -> str:
        return self.stdout.read_text(errors="replace")

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")


def start(
    args: list[str], cwd: Path, logs: Path, name: str = "run", setup: str | None = None
) -> Run:
    """Start ``probe ARGS`` in ``cwd``; its stdout and stderr go to files in ``logs``.
    ``setup``: ``"module:function"`` the child calls before the command (to plant a fault)."""
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    process = context().Process(
        target=_main,
        args=(list(args), str(cwd), str(stdout), str(stderr), setup),
        name=" ".join(args),
    )
    process.start()
    return Run(process, stdout, stderr)


def launch(
    args: list[str],
    out: Path | str,
    ranks: int | None = None,
    env: dict | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """``probe ARGS --out OUT`` in a fresh interpreter, one thread a process and the hub
    offline, with ``env`` added; with ``ranks``, as a torchrun job of that many ranks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    torchrun = []
    if ranks is not None:
        torchrun = [
            "-m",
            "torch.distributed.run",  # what the torchrun script runs
            "--standalone",  # a free port: tests may run side by side
            "--nproc-per-node",
            str(ranks),
        ]
    command = [sys.executable, *torchrun, "-m", "probe.cli", *args, "--out", str(out)]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def torchrun_beside_plain(args, tmp_path: Path, monkeypatch, pattern: str, timeout: float = 300):
    """``probe ARGS`` as a two-rank torchrun job in ``tmp_path/two`` and in this process in
    ``tmp_path/one``, each with ``--out r`` (the same command line, so even the recorded
    command is equal); both must succeed.  Returns the job's completed process and the two
    results matching ``pattern`` (job's first)."""
    from typer.testing import CliRunner

    from probe.cli.app import app

    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    done = launch(args, "r", ranks=2, cwd=tmp_path / "two", timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path / "one")
    single = CliRunner().invoke(app, [*args, "--out", "r"])
    assert single.exit_code == 0, single.output
    (two,) = (tmp_path / "two" / "r").glob(pattern)
    (one,) = (tmp_path / "one" / "r").glob(pattern)
    return done, two, one
