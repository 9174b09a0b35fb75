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
import os
import shlex
import sys
import tempfile
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
    ds = ds.copy()
    ds.attrs = netcdf_safe(ds.attrs)
    with _atomic(path) as tmp:
        ds.to_netcdf(tmp, engine=ENGINE)
    return Path(path)


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


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write a text file atomically, like :func:`save_result`."""
    with _atomic(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return Path(path)


@contextlib.contextmanager
def _atomic(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ProbeError(f"cannot create the output folder {path.parent}: {err.strerror}") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
