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
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import xarray as xr

from .errors import ProbeError

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
_NOT_SETTINGS = ("created", "command")


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
    """Write ``ds`` to ``path`` atomically (temporary file, then rename)."""
    with _atomic(path) as tmp:
        write_netcdf(ds, tmp)
    return Path(path)


def write_netcdf(ds: xr.Dataset, path: str | os.PathLike) -> None:
    """``ds`` as netCDF-4 at ``path`` (not atomic: see save_result and write_together)."""
    ds = ds.copy()
    ds.attrs = netcdf_safe(ds.attrs)
    ds.to_netcdf(path, engine=ENGINE)


def open_result(path: str | os.PathLike) -> xr.Dataset:
    """Open a result written by probe, fully loaded into memory (the file is closed)."""
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
}


def check_schema(ds: xr.Dataset, path: str | os.PathLike = "the result") -> None:
    """Raise ProbeError naming the first variable a result of its analysis lacks."""
    analysis = str(ds.attrs.get("analysis"))
    for name, dims in SCHEMAS.get(analysis, {}).items():
        if name not in ds.data_vars:
            raise ProbeError(
                f"{path} is a {analysis} result without the variable {name!r}: "
                "it was damaged or edited; run the probe again"
            )
        if set(ds[name].dims) != set(dims):
            raise ProbeError(
                f"{path}: {name} has dims ({', '.join(ds[name].dims)}), expected "
                f"({', '.join(dims)}); run the probe again"
            )


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write a text file atomically, like :func:`save_result`."""
    with _atomic(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return Path(path)


def write_together(writers: dict[Path, Callable[[str], None]]) -> list[Path]:
    """Write several files as one unit: all or none of them appear.

    Each writer fills a temporary file beside its target; only when every one has
    succeeded are they renamed into place, with SIGINT and SIGTERM held back for
    the few renames so that an interrupt cannot leave a result without its report.
    """
    temps: dict[Path, str] = {}
    try:
        for path, write in writers.items():
            temps[Path(path)] = temp_beside(Path(path))
            write(temps[Path(path)])
        with _signals_held():
            for path, tmp in temps.items():
                os.replace(tmp, path)
    except BaseException:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    return list(temps)


PART = ".part"


def clean_parts(folder: str | os.PathLike) -> list[Path]:
    """Remove temporary files that a killed probe left in ``folder`` (never another live run's)."""
    removed = []
    for part in Path(folder).glob(f".*{PART}"):
        pid = part.name.rsplit(".", 3)[-3] if part.name.count(".") >= 3 else ""
        if pid.isdigit() and _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            part.unlink()
            removed.append(part)
    return removed


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


def temp_beside(path: Path) -> str:
    """An empty temporary file next to ``path``: ``.<name>.<pid>.<random>.part``.

    The pid lets a later run tell a file left by a killed process from one being
    written right now; the mode follows the umask, as for any file a tool writes.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ProbeError(f"cannot create the output folder {path.parent}: {err.strerror}") from None
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


@contextlib.contextmanager
def _signals_held():
    """Defer SIGINT and SIGTERM until the block is done (main thread, POSIX only)."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, ValueError):  # not POSIX, or not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def _atomic(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ``ds.probe`` for every Dataset, from the moment results are written or read.
from . import accessor as _accessor  # noqa: E402,F401
