"""The result format: one xarray schema, saved and opened in one place.

A collapse result has dims ``variant x init x layer x sequence`` (plus ``fit``
and ``norm`` for the relative residual) and carries its provenance in
``attrs``.  Files are netCDF-4 (h5netcdf engine), written atomically: the data
go to a temporary file in the target folder, which is then renamed, so a
crashed or interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import xarray as xr

from .errors import ProbeError
from .interrupts import check_interrupt

ENGINE = "h5netcdf"


def versions() -> dict[str, str]:
    """Versions of probe and of the libraries that produced a result."""
    out = {}
    for package in ("probe", "torch", "transformers", "nnsight"):
        try:
            out[f"{package}_version"] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[f"{package}_version"] = "unknown"
    return out


def command_line() -> str:
    """The command that produced this process, as a user would type it."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("probe", "__main__.py"):
        argv[0] = "probe"
    return shlex.join(argv)


def settings_id(settings: dict) -> str:
    """A short stable hash of everything that changes a result's numbers.

    It goes into file names, so two runs that differ in any setting never write
    the same path, and a rerun with the same settings replaces its own result.
    """
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


#: Attributes that describe a run without changing its numbers.
#: Attributes that do not change a result's numbers (a torchrun run equals one process).
_NOT_SETTINGS = ("created", "command", "world_size")


def attrs_id(attrs: dict) -> str:
    """``settings_id`` of a result's attributes, less the time, the command and versions."""
    kept = {k: v for k, v in attrs.items() if k not in _NOT_SETTINGS and not k.endswith("_version")}
    return settings_id(kept)


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def netcdf_safe(attrs: dict) -> dict:
    """netCDF attributes hold strings and numbers only: bools and None become strings."""
    safe = {}
    for key, value in attrs.items():
        if isinstance(value, bool) or value is None:
            value = str(value)
        elif not isinstance(value, int | float | str):
            value = str(value)
        safe[key] = value
    return safe


def save_result(ds: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write ``ds`` to ``path`` atomically (temporary file, then rename: a unit of one)."""
    return write_together({Path(path): lambda tmp: write_netcdf(ds, tmp)})[0]


def write_netcdf(ds: xr.Dataset, path: str | os.PathLike) -> None:
    """``ds`` as netCDF-4 at ``path`` (not atomic: see save_result and write_together)."""
    ds = ds.copy()
    ds.attrs = netcdf_safe(ds.attrs)
    ds.to_netcdf(path, engine=ENGINE)


def open_result(path: str | os.PathLike) -> xr.Dataset:
    """Open a result written by probe, fully loaded into memory (the file is closed)."""
    if not isinstance(path, str | os.PathLike):
        raise ProbeError(f"`path` must be a file path; got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise ProbeError(f"no such result file: {path}")
    try:
        with xr.open_dataset(path, engine=ENGINE) as ds:
            loaded = ds.load()
    except (OSError, ValueError) as err:
        raise ProbeError(f"{path} is not a probe result (netCDF): {err}") from None
    if "analysis" not in loaded.attrs:
        raise ProbeError(
            f"{path} is a netCDF file but not a probe result (no 'analysis' attribute)"
        )
    return loaded


#: Variables (and their dims) a result of each analysis must hold to be rendered.
SCHEMAS: dict[str, dict[str, tuple[str, ...]]] = {
    "collapse": {
        "relative_residual": ("variant", "init", "layer", "sequence", "fit", "norm"),
        "effective_rank": ("variant", "init", "layer", "sequence"),
        "stable_rank": ("variant", "init", "layer", "sequence"),
        "cosine_similarity": ("variant", "init", "layer", "sequence"),
    },
    "paths-count": {
        "share": ("architecture", "path_length"),
        "cumulative_share": ("architecture", "path_length"),
        "log10_count": ("architecture", "path_length"),
        "count": ("architecture", "path_length"),
        "total": ("architecture",),
        "mean_length": ("architecture",),
    },
    "paths-sample": {"ratio": ("init", "order", "depth", "sample", "fit", "norm")},
    "paths-decompose": {
        "share": ("init", "layer", "path_length", "sequence", "norm"),
        "truncation_error": ("init", "layer", "path_length", "sequence", "norm"),
        "effective_length": ("init", "layer", "sequence", "norm"),
        "uniform_share": ("layer", "path_length"),
        "uniform_mean_length": ("layer",),
        "output_share": ("init", "path_length", "sequence", "norm"),
        "cosine": ("init", "path_length", "sequence"),
    },
    "toy": {"train_loss": ()},  # the rest depends on the task: see TOY_SCHEMAS
    "training": {
        "train_loss": ("model", "step"),
        "seconds": ("model", "step"),
        "eval_step": ("model", "evaluation"),
        "eval_seconds": ("model", "evaluation"),
        "val_bits_per_char": ("model", "evaluation"),
    },
}
TOY_SCHEMAS: dict[str, dict[str, tuple[str, ...]]] = {
    "circle": {
        "trajectory": ("hidden", "variant", "step", "token", "coord"),
        "relative_residual": ("hidden", "variant", "step"),
        "train_loss": ("hidden", "variant", "epoch"),
    },
    "paths": {
        "accuracy": ("path_length", "repeat"),
        "paths": ("path_length", "repeat", "path"),
        "train_loss": ("epoch",),
        "full_accuracy": (),
        "baseline_majority": (),
        "baseline_position": (),
    },
}


#: Variables a result may leave out when its ``metrics`` attribute says so (``collapse
#: --metrics`` computes a subset; the relative residual, which every report draws, is always
#: there).
OPTIONAL_VARIABLES: dict[str, set[str]] = {
    "collapse": {"effective_rank", "stable_rank", "cosine_similarity"},
}
#: Dimensions results written before they existed lack: paths --sample's multiplication
#: ``order`` and the circle's ``hidden`` sweep (such results still render).
OPTIONAL_DIMS = {"order", "hidden"}


def check_schema(ds: xr.Dataset, path: str | os.PathLike = "the result") -> None:
    """Raise ProbeError naming the first variable a result of its analysis lacks, or the
    analysis itself when probe has no such one (a foreign or edited file)."""
    analysis = str(ds.attrs.get("analysis"))
    if analysis not in SCHEMAS:
        raise ProbeError(
            f"{path} is a result of the analysis {analysis!r}, which probe does not know; "
            f"it renders {', '.join(SCHEMAS)}"
        )
    schema = SCHEMAS[analysis]
    if analysis == "toy":
        schema = TOY_SCHEMAS["circle" if ds.attrs.get("task") == "circle" else "paths"]
    # A variable may be left out only when the result says it chose not to compute it (its
    # ``metrics`` attribute omits it); one it lists, or any in a result without the attribute,
    # is damage.
    chosen = ds.attrs.get("metrics")
    chosen = set(str(chosen).split(",")) if chosen is not None else None
    for name, dims in schema.items():
        left_out = chosen is not None and name not in chosen
        if (
            name not in ds.data_vars
            and left_out
            and name in OPTIONAL_VARIABLES.get(analysis, set())
        ):
            continue
        if name not in ds.data_vars:
            raise ProbeError(
                f"{path} is a {analysis} result without the variable {name!r}: "
                "it was damaged or edited; run the probe again"
            )
        if set(ds[name].dims) - OPTIONAL_DIMS != set(dims) - OPTIONAL_DIMS:
            raise ProbeError(
                f"{path}: {name} has dims ({', '.join(ds[name].dims)}), expected "
                f"({', '.join(dims)}); run the probe again"
            )


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write a text file atomically, like :func:`save_result`."""
    return write_together({Path(path): lambda tmp: Path(tmp).write_text(text, encoding="utf-8")})[0]


def write_together(
    writers: dict[Path, Callable[[str], None]],
    committed: Callable[[list[Path]], None] | None = None,
) -> list[Path]:
    """Write several files as one unit: all or none of them appear.

    Each writer fills a temporary file beside its target; only when every one has
    succeeded are they renamed into place (:class:`Unit`).  An interrupt is raised
    (``probe.interrupts``) before the renames or after them and ``committed(paths)``,
    never between: it cannot leave a result without its report, and a caller that records
    what it wrote (the CLI's interrupt line) cannot miss a file that was put in place.
    """
    with Unit() as unit:
        for path, write in writers.items():
            write(str(unit.file(Path(path))))
        return unit.commit(committed)


class Unit:
    """Files and folders written as one unit: staged beside their targets, then put in
    place together.

    ``file(target)`` and ``folder(target)`` give a staging path beside the target
    (``.<name>.<pid>.<random>.part``: the pid tells a later run whether its writer is
    still alive, see :func:`clean_parts`).  :meth:`commit` takes the lock of every
    target's folder (so concurrent runs into one folder put their units in place one
    after the other, never interleaved) and renames each staging path onto its target,
    with no interrupt raised in between (see :func:`write_together`); a folder that is replaced is first renamed to
    ``.<name>.<pid>.old`` and removed once the new one is in place (a kill -9 between the
    two renames is repaired by the next run, which renames it back).  Leaving the
    ``with`` block without a commit removes whatever was staged.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []
        self._done = False

    def __enter__(self) -> Unit:
        return self

    def __exit__(self, *exc) -> bool:
        if not self._done:
            self.discard()
        return False

    def file(self, target: Path) -> Path:
        staging = Path(temp_beside(Path(target)))
        self._staged.append((Path(target), staging))
        return staging

    def folder(self, target: Path) -> Path:
        target = Path(target)
        make_parent(target)
        clean_parts(target.parent)
        try:
            staging = tempfile.mkdtemp(
                prefix=f".{target.name}.{os.getpid()}.", suffix=PART, dir=target.parent
            )
        except OSError as err:
            raise ProbeError(f"cannot write to {target.parent}: {err.strerror}") from None
        os.chmod(staging, 0o777 & ~_umask())
        self._staged.append((target, Path(staging)))
        return Path(staging)

    def commit(self, committed: Callable[[list[Path]], None] | None = None) -> list[Path]:
        targets = [target for target, _ in self._staged]
        olds: list[Path] = []
        with contextlib.ExitStack() as locks:
            for folder in sorted({t.parent.resolve() for t in targets}):
                locks.enter_context(folder_lock(folder))
            check_interrupt()  # one that came while the unit was written: none of it appears
            for target, staging in self._staged:
                if staging.is_dir() and target.is_dir() and not target.is_symlink():
                    old = target.with_name(f".{target.name}.{os.getpid()}.old")
                    shutil.rmtree(old, ignore_errors=True)
                    os.rename(target, old)
                    olds.append(old)
                os.replace(staging, target)
            self._done = True
            if committed is not None:
                committed(targets)
        for old in olds:
            shutil.rmtree(old, ignore_errors=True)
        check_interrupt()  # one that came during the renames: all of the unit is in place
        return targets

    def discard(self) -> None:
        for _, staging in self._staged:
            _remove(staging)
        self._done = True


_HELD: set[str] = set()  # folders this process holds the lock of (flock is not re-entrant)


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike):
    """Hold an exclusive lock on ``folder`` (flock on the folder itself: no lock file is
    left behind).  Re-entrant within a process; where locks are not available, nothing
    is held."""
    key = os.path.realpath(folder)
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    if fcntl is None or key in _HELD:
        yield
        return
    try:
        fd = os.open(key, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD.add(key)
        yield
    finally:
        _HELD.discard(key)
        os.close(fd)  # releases the lock


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


PART = ".part"
OLD = ".old"
#: A torchrun job's shard folder: ``.probe-shards-<host>-<pid of rank 0>-<random>``.
SHARDS = ".probe-shards-"


def _pid_of(name: str, suffix: str) -> int | None:
    """The writer's pid in ``.<name>.<pid>.<random>.part`` or ``.<name>.<pid>.old``."""
    parts = name.removesuffix(suffix).rsplit(".", 2 if suffix == PART else 1)
    pid = parts[-2] if suffix == PART and len(parts) == 3 else parts[-1]
    return int(pid) if pid.isdigit() else None


def clean_parts(folder: str | os.PathLike) -> list[Path]:
    """Remove what killed probe runs left in ``folder`` (never another live run's).

    Staged files and folders (``.*.part``) of dead processes are removed; a folder a dead
    process had moved aside to replace it (``.<name>.<pid>.old``) is put back where its
    replacement never arrived, else removed.  Leftovers named by earlier versions of
    ``probe fastformer train`` (``.<name>.tmp-<pid>``, ``.<name>.old-<pid>``) likewise.
    """
    removed = []
    folder = Path(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith("."):
            continue
        legacy = re.fullmatch(r"\.(.+)\.(tmp|old)-([0-9]+)", name)
        shards = re.fullmatch(re.escape(SHARDS + socket.gethostname()) + r"-([0-9]+)-.+", name)
        if shards:  # a torchrun job's shard folder, made by rank 0 on this host
            pid, target = int(shards.group(1)), None
        elif name.endswith(PART):
            pid, target = _pid_of(name, PART), None
        elif name.endswith(OLD) and name.count(".") >= 3:
            pid, target = _pid_of(name, OLD), folder / name[1:].rsplit(".", 2)[0]
        elif legacy:
            pid = int(legacy.group(3))
            target = folder / legacy.group(1) if legacy.group(2) == "old" else None
        else:
            continue
        if pid is None or _alive(pid):
            continue
        if target is not None and not target.exists() and entry.is_dir():
            with contextlib.suppress(OSError):
                os.rename(entry, target)  # the replacement never arrived: the old one stays
                continue
        _remove(entry)
        removed.append(entry)
    return sorted(removed)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ProbeError(f"cannot create the output folder {path.parent}: {err.strerror}") from None


def temp_beside(path: Path) -> str:
    """An empty temporary file next to ``path``: ``.<name>.<pid>.<random>.part``.

    The pid lets a later run tell a file left by a killed process from one being
    written right now; the mode follows the umask, as for any file a tool writes.
    """
    make_parent(path)
    clean_parts(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{path.name}.{os.getpid()}.", suffix=PART, dir=path.parent
        )
    except OSError as err:
        raise ProbeError(f"cannot write to {path.parent}: {err.strerror}") from None
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return tmp


# ``ds.probe`` for every Dataset, from the moment results are written or read.
from . import accessor as _accessor  # noqa: E402,F401
