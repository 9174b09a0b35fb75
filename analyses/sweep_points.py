"""The points of a sweep: its grid of settings, and the store that keeps each finished point.

A sweep varies a few settings of one ``probe collapse`` request (:mod:`probe.analyses.sweep`).
Each varied setting is an :class:`Axis`: its name (the dimension of the result), its
values, and what it changes in the request:

* ``config``: one field of the model's config at random init (``n_layer``, ``hidden_size``,
  ``initializer_range`` ...), through ``probe.Model(config=...)``;
* ``branch_scale``: the residual branches' scale alpha (a number or a text in ``L``, the
  depth, such as ``1/sqrt(L)``), the collapse analysis's own option;
* ``revision``: a hub revision of the checkpoint (``step1000``), ``probe.Model(revision=...)``;
* ``step``: training steps of several local checkpoints, one folder per step: the model
  source itself;
* ``tokens``: real tokens per sequence (``probe.Inputs(tokens=...)``);
* ``seed``: the seed of the random init and of the synthetic inputs (``probe.Model(seed=...)``).

The grid is the product of the axes, in their order, the last varying fastest.  A
:class:`Point` is one cell: a value per axis.  Its identity (:meth:`Store.path`) is the hash of
the sweep's fixed settings and its own values, so the same point of a larger grid (one more
seed, say) is the same file.

The store (:class:`Store`): one netCDF file per finished point in one folder for every
sweep written to the same place, ``<out>/sweep-points/point-<id>.nc``, written as a unit
(:func:`probe.files.results.save_result`: staged, then renamed), so an interrupted or killed sweep
keeps its finished points and never holds half of one.  A point's id hashes what it ran: the
weights (a folder by its files' bytes), the inputs (the text's and the images' bytes), the
settings and the point's own values, never the grid, so any grid that holds the point finds
it.  A point file records those settings (attribute ``sweep_point``); the store takes a file
as the point only when they match and it holds every variable the store requires (a
sweep's summaries), so a point written before a summary existed is run again.

Several processes may share a store (two sweeps into one folder, the ranks of a torchrun
job): a point is run under its claim (an exclusive ``flock`` on ``point-<id>.lock``), and
read again once claimed, so a point another process has just finished is read, not run
twice.  A sweep holds the store shared while it runs (:meth:`Store.using`); only a sweep that
can hold it alone removes its points once its result is written, so no sweep removes a
point another is reading.  Points of other grids stay, and are named, for the sweeps that
resume from them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

import xarray as xr

from probe.errors import ProbeError
from probe.files.results import ENGINE, save_result, settings_id
from probe.requests import checks
from probe.requests.overrides import value_of

#: The store's folder in a sweep's `out`, shared by every sweep written there.
FOLDER = "sweep-points"
#: What each kind of axis changes; dimensions with these names are not config fields.
KINDS = ("config", "branch_scale", "revision", "step", "tokens", "seed")
#: Names a config field may not take as a dimension: the result's own dimensions.
RESERVED = (*KINDS, "point", "variant", "init", "layer", "sequence", "token", "fit", "norm", "head")


@dataclass(frozen=True)
class Axis:
    """One swept setting and its values.

    Parameters
    ----------
    name
        The result's dimension (`n_layer`, `branch_scale`, `seed`, ...).
    kind
        `config`, `branch_scale`, `mask`, `revision`, `step`, `tokens` or `seed`.
    values
        The values swept, as given.
    folders
        A `step` axis: the checkpoint folder of each step.

    Raises
    ------
    ProbeError
        No values, or a value given twice.
    """

    name: str
    kind: str
    values: tuple
    folders: tuple = ()

    def __post_init__(self) -> None:
        if not self.values:
            raise ProbeError(f"`{self.name}` has no values to sweep")
        seen = [str(v) for v in self.values]
        twice = sorted({v for v in seen if seen.count(v) > 1})
        if twice:
            raise ProbeError(f"`{self.name}` gives {', '.join(twice)} more than once")


@dataclass(frozen=True)
class Point:
    """One cell of the grid: one value of every axis.

    Parameters
    ----------
    axes
        The sweep's axes.
    values
        This point's value of each axis, in the order of `axes`.
    """

    axes: tuple[Axis, ...]
    values: tuple

    def __getitem__(self, name: str):
        return dict(zip((a.name for a in self.axes), self.values, strict=True))[name]

    def label(self) -> str:
        """``n_layer=4, branch_scale=1/sqrt(L), seed=0``: the point as a person names it."""
        return ", ".join(f"{a.name}={v}" for a, v in zip(self.axes, self.values, strict=True))

    def as_dict(self) -> dict:
        return {a.name: v for a, v in zip(self.axes, self.values, strict=True)}

    def folder(self) -> str | None:
        """The checkpoint folder of a ``step`` point (None without a step axis)."""
        for axis, value in zip(self.axes, self.values, strict=True):
            if axis.kind == "step":
                return axis.folders[axis.values.index(value)]
        return None


def grid(axes: Sequence[Axis]) -> list[Point]:
    """Every point of the product of ``axes``, the last axis varying fastest."""
    import itertools

    axes = tuple(axes)
    return [Point(axes, values) for values in itertools.product(*(a.values for a in axes))]


# --- reading the values of an axis --------------------------------------------------------


def listed(given, name: str) -> tuple:
    """One value, or an ordered collection of them (a list, tuple, range or numpy array), as
    a tuple of plain Python values (numpy scalars as the numbers they hold); ProbeError for
    an empty or unordered collection (a set, a mapping) and for bytes."""
    if isinstance(given, Mapping | Set | bytes | bytearray):
        raise ProbeError(
            f"`{name}` takes one value or a list of values, got {type(given).__name__}"
        )
    if getattr(given, "ndim", None) == 0:  # a numpy scalar or 0-d array: one value
        given = given.item() if hasattr(given, "item") else given
    many = isinstance(given, Iterable) and not isinstance(given, str)
    values = tuple(checks.plain(v) for v in given) if many else (checks.plain(given),)
    if not values:
        raise ProbeError(f"`{name}` has no values; give one value or more")
    return values


def parse_counts(text, name: str, low: int, high: int) -> tuple[int, ...]:
    """``64,256,1024``, ``0-4`` or ``0,3,7`` (ranges inclusive) -> whole numbers in
    [low, high], in the order given; a number or a list of numbers is checked the same way."""
    if not isinstance(text, str):
        return tuple(checks.integer(f"`{name}`", v, low, high) for v in listed(text, name))
    values: list[int] = []
    for item in text.split(","):
        item = item.strip()
        first, dash, last = item.partition("-")
        if dash and first.strip() and last.strip():
            start = checks.integer(f"`{name}`", first.strip(), low, high)
            stop = checks.integer(f"`{name}`", last.strip(), low, high)
            if stop < start:
                raise ProbeError(f"`{name}` range {item} runs backwards; write {stop}-{start}")
            if stop - start >= 100_000:
                raise ProbeError(f"`{name}` range {item} holds over 100000 values")
            values += range(start, stop + 1)
        else:
            values.append(checks.integer(f"`{name}`", item, low, high))
    return tuple(values)


def parse_setting(text: str) -> tuple[str, tuple]:
    """``KEY=V1,V2,...`` -> (key, values)."""
    key, eq, rest = str(text).partition("=")
    key = key.strip()
    if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise ProbeError(
            f"`set` takes KEY=V1,V2,... with KEY a config field; got {checks.shown(text)}"
        )
    config_key(key)
    items = [item.strip() for item in rest.split(",")]
    if not rest.strip() or not all(items):
        raise ProbeError(f"`set` {key} has an empty value; give KEY=V1,V2,...")
    # Each value as ``probe collapse --set`` reads it, so that a sweep's point and its
    # collapse run read one value alike.
    return key, tuple(value_of(key, item) for item in items)


def config_key(key) -> str:
    """A config field a sweep may vary: a name, and none of the result's own dimensions."""
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise ProbeError(f"`config` key {key!r} is not a config field name")
    if key in RESERVED:
        raise ProbeError(
            f"`set` cannot sweep a config field named {key}: the result has a dimension of "
            "that name"
        )
    return key


def parse_config(config) -> list[tuple[str, tuple]]:
    """A sweep's ``config``, ``{field: values}`` (a list of values, one value, or a text
    ``"V1,V2"``) -> (field, values) in the order given."""
    if not isinstance(config, Mapping):
        raise ProbeError(
            "`config` takes a mapping of config fields to the values to sweep "
            f"(such as {{'n_layer': [2, 4]}}), got {type(config).__name__}"
        )
    found = []
    for key, values in config.items():
        if isinstance(values, str):
            found.append(parse_setting(f"{config_key(key)}={values}"))
        else:
            found.append((config_key(key), listed(values, "config")))
    return found


def parse_steps(steps) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(training step, checkpoint folder) pairs -> the steps (whole numbers >= 0, increasing)
    and their folders (each one that exists)."""
    numbers, folders = [], []
    for pair in listed(steps, "steps"):
        if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ProbeError(f"`steps` takes (step, folder) pairs, got {checks.shown(pair)}")
        step, folder = pair
        numbers.append(checks.integer("`steps`", step, 0, checks.MAX_SEED))
        checks.readable_folder(folder, "`steps`", "checkpoint folder")
        folders.append(str(folder))
    if numbers != sorted(numbers):
        raise ProbeError("`steps` must increase along the checkpoints")
    return tuple(numbers), tuple(folders)


def parse_words(text, name: str) -> tuple[str, ...]:
    """A comma list of non-empty words (branch scales, revisions), or a list of them."""
    items = text.split(",") if isinstance(text, str) else [str(v) for v in listed(text, name)]
    words = tuple(item.strip() for item in items)
    if not words or not all(words):
        raise ProbeError(f"`{name}` has an empty value; give a comma list")
    return words


def series(name: str) -> list[tuple[int, str]] | None:
    """A checkpoint series (``gpt2-tiny-steps``, or a folder one training run wrote): its
    (step, folder) pairs; None for any other name.  A damaged series is said in one line."""
    from probe.loading.shipped import series as shipped

    found = shipped(name)
    return [(int(step), str(folder)) for step, folder in found] if found else None


# --- the store ------------------------------------------------------------------------------


def point_settings(fixed: dict, point: Point) -> dict:
    values = point.as_dict()
    folder = point.folder()
    if folder is not None:  # the step's checkpoint by what it holds, not by its path
        from probe.loading.identity import folder_fingerprint

        values["checkpoint"] = folder_fingerprint(folder)
    return {**fixed, "point": values}


class Store:
    """The folder of a sweep's finished points: `point-<id>.nc` each (module docstring).

    A point's file holds its settings; one written under other settings, or damaged, is
    not read back but run again.

    Parameters
    ----------
    folder
        The folder (made when the first point is written).
    fixed
        The settings every point of the sweep shares.
    required
        Variables a point's file must hold to be taken (a sweep's summaries): a file
        without one was written before it existed, and the point is run again.
    """

    def __init__(self, folder: str | Path, fixed: dict, required: Iterable[str] = ()) -> None:
        self.folder = Path(folder)
        self.fixed = fixed
        self.required = tuple(required)
        self._held: int | None = None  # the descriptor of `using`'s shared hold
        # Each point's settings, computed once: a step's checkpoint is hashed whole (every
        # byte), not again at each look at its file.
        self._settings: dict[Point, dict] = {}

    def settings(self, point: Point) -> dict:
        """The point's settings (:func:`point_settings`), once per store."""
        if point not in self._settings:
            self._settings[point] = point_settings(self.fixed, point)
        return self._settings[point]

    def path(self, point: Point) -> Path:
        return self.folder / f"point-{settings_id(self.settings(point))}.nc"

    def expected(self, point: Point) -> str:
        return json.dumps(self.settings(point), sort_keys=True, default=str)

    def read(self, point: Point) -> xr.Dataset | None:
        """The finished point, loaded, or None: no file, a damaged one, or other settings."""
        path = self.path(point)
        if not path.is_file():
            return None
        try:
            with xr.open_dataset(path, engine=ENGINE) as ds:
                if not self._matches(ds, point):
                    return None
                return ds.load()
        except (OSError, ValueError):
            return None

    def done(self, points: Sequence[Point]) -> list[bool]:
        """Whether each point has its file with matching settings (attributes read only)."""
        found = []
        for point in points:
            path = self.path(point)
            ok = False
            if path.is_file():
                try:
                    with xr.open_dataset(path, engine=ENGINE) as ds:
                        ok = self._matches(ds, point)
                except (OSError, ValueError):
                    ok = False
            found.append(ok)
        return found

    def _matches(self, ds: xr.Dataset, point: Point) -> bool:
        """Whether a file is the point: its settings, and every variable the store requires
        (a point written before one of them existed is run again)."""
        return ds.attrs.get("sweep_point") == self.expected(point) and set(self.required) <= set(
            ds.data_vars
        )

    def write(self, point: Point, ds: xr.Dataset) -> Path:
        """Put the point in place as a unit (staged, renamed): whole or not at all."""
        ds = ds.copy()
        ds.attrs["sweep_point"] = self.expected(point)
        ds.attrs["sweep_values"] = json.dumps(point.as_dict(), default=str)
        self.folder.mkdir(parents=True, exist_ok=True)
        return save_result(ds, self.path(point))

    def keep(self, point: Point, compute) -> tuple[xr.Dataset, bool]:
        """The point: read from the store (True), or ``compute()`` d and written (False).

        The point is run under its claim and looked for again once claimed: a process that
        waited for another to finish the point reads it instead of running it again."""
        ds = self.read(point)
        if ds is not None:
            return ds, True
        self.folder.mkdir(parents=True, exist_ok=True)
        claim = self.path(point).with_suffix(".lock")
        with _locked(claim, fcntl.LOCK_EX):
            try:
                ds = self.read(point)
                kept = ds is not None
                if ds is None:
                    ds = compute()
                    self.write(point, ds)
            finally:
                # Removed while held: a process waiting on it looks for the point once it
                # has the claim; one arriving later claims a new file.
                claim.unlink(missing_ok=True)
        return ds, kept

    @contextlib.contextmanager
    def using(self):
        """Hold the store shared while a sweep runs, so none removes points it needs."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            with _locked(self.folder / ".in-use", fcntl.LOCK_SH) as fd:
                self._held = fd
                yield self
        finally:
            self._held = None
            _tidy(self.folder)  # once this sweep's hold is let go

    def clean(self, points: Sequence[Point]) -> int:
        """After the result is written: remove ``points``' files if no other sweep uses the
        store, and the folder once nothing is left in it.  Returns how many files of other
        sweeps' points stay (0 when the folder is gone, or another sweep holds it)."""
        if self._held is not None:
            try:  # shared -> alone, without waiting: another sweep may need these points
                fcntl.flock(self._held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                # Said finished: the last sweep to let go of the store removes them.
                _finished(self.folder, [self.path(point).name for point in points])
                return 0
        for point in points:
            self.path(point).unlink(missing_ok=True)
        if not self.folder.is_dir():
            return 0
        _remove_finished(self.folder)  # alone: other sweeps' finished points go too
        return len(list(self.folder.glob("point-*.nc")))


@contextlib.contextmanager
def _locked(path: Path, how: int):
    """``path`` opened (made if missing) and ``flock``ed with ``how``; the descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how)
        yield fd
    finally:
        os.close(fd)


#: A list of point files whose sweep wrote its result while another sweep used the store.
FINISHED = ".finished-"


def _finished(folder: Path, names: list[str]) -> None:
    """Record ``names`` as points of a sweep whose result is written (a file of its own,
    put in place whole), for :func:`_tidy` to remove once no sweep uses the store."""
    fd, staged = tempfile.mkstemp(prefix=".stage-", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("\n".join(names))
    os.replace(staged, folder / f"{FINISHED}{Path(staged).name.removeprefix('.stage-')}")


def _remove_finished(folder: Path) -> None:
    """The points :func:`_finished` recorded, and its records (the store held alone)."""
    for done in folder.glob(f"{FINISHED}*"):
        for name in done.read_text(encoding="utf-8").split():
            if name.startswith("point-") and "/" not in name:
                (folder / name).unlink(missing_ok=True)
        done.unlink(missing_ok=True)


def _tidy(folder: Path) -> None:
    """Once no other sweep uses the store: remove the points of sweeps whose results are
    written (:func:`_finished`), then the folder when it holds no point."""
    if not folder.is_dir():
        return
    try:
        fd = os.open(folder / ".in-use", os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    try:
        _remove_finished(folder)
        if any(folder.glob("point-*.nc")):
            return
        for leftover in folder.iterdir():  # the lock files, and stages a kill left behind
            if leftover.is_file():
                leftover.unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        pass
    finally:
        os.close(fd)
