"""The result format: one xarray schema, saved and opened in one place.

A collapse result has dims ``variant x init x layer x sequence`` (plus ``fit``
and ``norm`` for the relative residual) and carries its provenance in
``attrs``.  Files are netCDF-4 (h5netcdf engine), written atomically: the data
go to a temporary file in the target folder, which is then renamed, so a
crashed or interrupted run never leaves a half-written result behind.

A result is built in memory and its bytes written by Python (:func:`write_netcdf`): HDF5
never sees a full disk (see ``probe.files.staging``, which puts files in place).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sys
from importlib import metadata
from pathlib import Path

import xarray as xr

from probe import registry
from probe.errors import ProbeError
from probe.files.names import command, readable

# The write path lives in probe.files.staging; much of probe reaches it through this module.
from probe.files.staging import (  # noqa: F401
    PART,
    SHARDS,
    Sink,
    Unit,
    check_space,
    clean_parts,
    folder_lock,
    free_space,
    make_parent,
    temp_beside,
    write_error,
    write_together,
)

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
    return command(argv)


def settings_id(settings: dict) -> str:
    """A short stable hash of everything that changes a result's numbers.

    It goes into file names, so two runs that differ in any setting never write
    the same path, and a rerun with the same settings replaces its own result.
    """
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


#: Attributes that describe a run without changing its numbers.
#: Attributes that do not change a result's numbers (a torchrun run equals one process).
_NOT_SETTINGS = ("created", "command", "request", "world_size")


def attrs_id(attrs: dict) -> str:
    """``settings_id`` of a result's attributes, less the time, the command and versions."""
    kept = {k: v for k, v in attrs.items() if k not in _NOT_SETTINGS and not k.endswith("_version")}
    return settings_id(kept)


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def netcdf_safe(attrs: dict) -> dict:
    """netCDF attributes hold strings and numbers only: bools and None become strings, and
    text holds UTF-8 only (:func:`probe.files.names.readable`)."""
    safe = {}
    for key, value in attrs.items():
        if isinstance(value, bool) or value is None:
            value = str(value)
        elif not isinstance(value, int | float | str):
            value = str(value)
        if isinstance(value, str):  # a path whose bytes are not UTF-8: its bytes as \xNN
            value = readable(value)
        safe[key] = value
    return safe


def save_result(ds: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write a result to a netCDF file, atomically.

    The Dataset is written to a temporary file beside `path`, then renamed onto it: `path`
    holds either the whole result or what it held before.  Attributes netCDF cannot hold
    (bools, None, other objects) are written as strings.

    Parameters
    ----------
    ds
        The result, as an analysis returns it.
    path
        The file to write, such as `result.nc`; an existing file is replaced.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    ProbeError
        `ds` is not an `xarray.Dataset`, `path` is not a file path, or the write failed (a
        full disk, a folder that cannot be written); nothing is left at `path` then.
    """
    if not isinstance(ds, xr.Dataset):
        raise ProbeError(f"`ds` must be an xarray.Dataset; got {type(ds).__name__}")
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ProbeError("`path` must be a file path such as result.nc")
    return write_together({Path(path): lambda tmp: write_netcdf(ds, tmp)})[0]


def write_netcdf(ds: xr.Dataset, path: str | os.PathLike) -> None:
    """``ds`` as netCDF-4 at ``path`` (not atomic: see save_result and write_together).

    HDF5 never meets a full disk: a result in memory is built in memory (``to_netcdf()``
    without a path returns its bytes) and written by Python; a lazy one (dask arrays, a
    torchrun job's merged shards, larger than memory may hold) is written chunk by chunk
    through a :class:`Sink`.  Either way a failed write is an ``OSError`` here, once."""
    ds = ds.copy()
    ds.attrs = netcdf_safe(ds.attrs)
    if ds.chunks:
        with Sink(path) as sink:
            try:
                ds.to_netcdf(sink, engine=ENGINE)
            except Exception:
                sink.check()  # HDF5 read back what the full disk dropped: say the disk
                raise
            sink.check()
        return
    data = ds.to_netcdf(engine=ENGINE)
    with open(path, "wb") as file:
        file.write(data)


def open_result(path: str | os.PathLike) -> xr.Dataset:
    """Open a result written by probe, fully loaded into memory (the file is closed).

    Parameters
    ----------
    path
        A netCDF file written by [`save_result`][probe.files.results.save_result] or the `probe`
        command.

    Returns
    -------
    xarray.Dataset
        The result, with the attributes that say how it was made.

    Raises
    ------
    ProbeError
        `path` is not a file path, does not exist, is not netCDF, or is a netCDF file
        without probe's `analysis` attribute.
    """
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


#: A toy result's variables, by task (its registered variables are what every task has).
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
    known = registry.find(analysis)  # the variables it must hold, as registered
    if known is None:
        raise ProbeError(
            f"{path} is a result of the analysis {analysis!r}, which probe does not know; "
            f"it renders {', '.join(a.name for a in registry.ANALYSES)}"
        )
    schema = dict(known.variables)
    if analysis == "toy":
        schema = TOY_SCHEMAS["circle" if ds.attrs.get("task") == "circle" else "paths"]
    # A variable may be left out only when the result says it chose not to compute it (its
    # ``metrics`` attribute omits it); one it lists, or any in a result without the attribute,
    # is damage.
    chosen = ds.attrs.get("metrics")
    chosen = set(str(chosen).split(",")) if chosen is not None else None
    swept: set[str] = set()
    if analysis == "sweep":  # its own dimensions: the swept settings
        try:
            swept = set(json.loads(str(ds.attrs.get("sweep_dims"))))
        except (ValueError, TypeError):
            raise ProbeError(
                f"{path}: its sweep_dims attribute is damaged; run the sweep again"
            ) from None
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
        if set(ds[name].dims) - OPTIONAL_DIMS - swept != set(dims) - OPTIONAL_DIMS:
            raise ProbeError(
                f"{path}: {name} has dims ({', '.join(ds[name].dims)}), expected "
                f"({', '.join(dims)}); run the probe again"
            )


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write a text file atomically, like :func:`save_result`."""
    return write_together({Path(path): lambda tmp: Path(tmp).write_text(text, encoding="utf-8")})[0]


# ``ds.probe`` for every Dataset, from the moment results are written or read.
from probe.files import accessor as _accessor  # noqa: E402,F401
