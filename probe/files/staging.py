"""Files put in place as units: staged beside their targets, renamed together, or not at all.

Every file probe writes (results, reports, checkpoints, the index) is first written to a
staging path beside its target (``.<name>.<pid>.<random>.part``), then renamed onto it
(:func:`write_together`, :class:`Unit`): a reader sees the old file or the new one, never
half of one, and a result never appears without its report.  A write that fails (a full
disk, a quota, an immutable file or a folder in the way) is one line, :func:`write_error`,
and leaves nothing of its unit behind.  Staging that a killed run left is removed by the
next run that writes into the folder (:func:`clean_parts`), never another live run's.

HDF5 never writes to the disk itself where the disk may fill: ``probe.files.results`` builds a
result in memory and writes its bytes, and a streamed one (``probe.files.stream``) writes
through :class:`Sink`.  HDF5 does not survive a failed write (it prints a traceback for
every object it frees, retries, or corrupts the heap); Python's ``write`` fails once.
Space is checked before the work starts (:func:`check_space`), so that a run that cannot
be written is refused before its computation, not after.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from probe.errors import ProbeError
from probe.files.interrupts import check_interrupt


def write_together(
    writers: dict[Path, Callable[[str], None]],
    committed: Callable[[list[Path]], None] | None = None,
) -> list[Path]:
    """Write several files as one unit: all or none of them appear.

    Each writer fills a temporary file beside its target; only when every one has
    succeeded are they renamed into place (:class:`Unit`).  An interrupt is raised
    (``probe.files.interrupts``) before the renames or after them and ``committed(paths)``,
    never between: it cannot leave a result without its report, and a caller that records
    what it wrote (the CLI's interrupt line) cannot miss a file that was put in place.
    """
    with Unit() as unit:
        for path, write in writers.items():
            staging = unit.file(Path(path))
            try:
                write(str(staging))
            except OSError as err:  # a full disk, a quota: one line, the staging removed
                raise write_error(path, err) from None
        return unit.commit(committed)


class Unit:
    """Files and folders written as one unit: staged beside their targets, then put in
    place together.

    ``file(target)`` and ``folder(target)`` give a staging path beside the target
    (``.<name>.<pid>.<random>.part``: the pid tells a later run whether its writer is
    still alive, see :func:`clean_parts`).  :meth:`commit` takes the lock of every
    target's folder (so concurrent runs into one folder put their units in place one
    after the other, never interleaved) and renames each staging path onto its target,
    with no interrupt raised in between (see :func:`write_together`).  What a target held
    is kept aside as ``.<name>.<pid>.old`` (a hard link of a file, so the file never goes
    missing; a folder, renamed) until every rename has succeeded: a rename that fails (an
    immutable file, a folder where a file goes) puts the earlier targets back as they were,
    and the unit is one line (:func:`write_error`), with nothing of it in place.  A kill -9
    between the renames is repaired by the next run, which puts the ``.old`` back.
    Leaving the ``with`` block without a commit removes whatever was staged.
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
        placed: list[tuple[Path, Path | None]] = []  # (target, what it held, set aside)
        with contextlib.ExitStack() as locks:
            for folder in sorted({t.parent.resolve() for t in targets}):
                locks.enter_context(folder_lock(folder))
            check_interrupt()  # one that came while the unit was written: none of it appears
            for target, staging in self._staged:
                try:
                    old = _set_aside(target, staging)
                    try:
                        os.replace(staging, target)
                    except OSError:
                        if old is not None:
                            _put_back(old, target)
                        raise
                except OSError as err:
                    for done, kept in reversed(placed):
                        _remove(done)
                        if kept is not None:
                            _put_back(kept, done)
                    raise write_error(target, err) from None
                placed.append((target, old))
            self._done = True
            if committed is not None:
                committed(targets)
        for _, old in placed:
            if old is not None:
                _remove(old)
        check_interrupt()  # one that came during the renames: all of the unit is in place
        return targets

    def discard(self) -> None:
        for _, staging in self._staged:
            _remove(staging)
        self._done = True


def _set_aside(target: Path, staging: Path) -> Path | None:
    """Keep what ``target`` holds as ``.<name>.<pid>.old`` until its unit is in place: a
    file as a hard link (it stays where it is), a folder renamed; None when there is none.
    A folder where a file goes (or a file where a folder goes) is never replaced."""
    if not os.path.lexists(target):
        return None
    is_folder = target.is_dir() and not target.is_symlink()
    if is_folder != staging.is_dir():
        code = errno.EISDIR if is_folder else errno.ENOTDIR
        raise OSError(code, f"{'a folder' if is_folder else 'a file'} is in the way")
    old = target.with_name(f".{target.name}.{os.getpid()}.old")
    _remove(old)
    if not is_folder:
        try:
            os.link(target, old, follow_symlinks=False)
            return old
        except OSError as err:
            if err.errno == errno.EPERM and not _links_unsupported(target):
                raise  # an immutable or append-only file: it cannot be replaced either
    os.rename(target, old)
    return old


def _links_unsupported(path: Path) -> bool:
    """Whether hard links fail in ``path``'s folder whatever the file (some file systems)."""
    probe_from = Path(temp_beside(path))
    probe_to = probe_from.with_name(probe_from.name + ".link" + PART)
    try:
        os.link(probe_from, probe_to)
    except OSError:
        return True
    else:
        probe_to.unlink()
        return False
    finally:
        probe_from.unlink(missing_ok=True)


def _put_back(old: Path, target: Path) -> None:
    with contextlib.suppress(OSError):
        if os.path.lexists(target) and os.path.samestat(os.lstat(old), os.lstat(target)):
            os.unlink(old)  # a hard link of what is there: rename would leave both
        else:
            os.replace(old, target)


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
        if target is not None and not os.path.lexists(target):
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


class Sink(io.RawIOBase):
    """A file HDF5 writes through (h5py's file-object driver) that never reports a failure
    to it.

    The first ``OSError`` of a write is kept in :attr:`error` and every later write is
    dropped; the writer checks :meth:`check` after each of its steps and gives up there,
    removing the file.  HDF5 itself never sees the disk full, which it does not survive.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        self.path = Path(path)
        # Read and written by HDF5; created if missing, kept as it is otherwise.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        self._file = open(fd, "r+b", buffering=0)  # noqa: SIM115 (closed by close())
        self.error: OSError | None = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        return self._file.readinto(buffer)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += self._file.write(view[done:])
                return len(view)
            except OSError as err:
                self.error = err
        self._file.seek(len(view), os.SEEK_CUR)
        return len(view)

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._file.truncate(size)
            except OSError as err:
                self.error = err
        return self.tell() if size is None else size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()

    def check(self) -> None:
        """Raise the write error this file met, as one line (:func:`write_error`)."""
        if self.error is not None:
            raise write_error(self.path, self.error)


def write_error(path: str | os.PathLike, err: OSError) -> ProbeError:
    """A failed write as one line: the file, why, and (on a full disk) how much is free."""
    path = Path(path)
    why = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        why += f" ({_size(free_space(path.parent))} free in {path.parent})"
    return ProbeError(f"cannot write {_target(path)}: {why}; it was not written")


def _target(path: Path) -> Path:
    """The file a staging path stands for (``.<name>.<pid>.<random>.part`` -> ``<name>``)."""
    match = re.fullmatch(r"\.(.+)\.[0-9]+\.[^.]+" + re.escape(PART), path.name)
    return path.with_name(match.group(1)) if match else path


def free_space(folder: str | os.PathLike) -> int:
    """Bytes free to this user in the file system of ``folder`` (or of its nearest existing
    parent: the folder may not be made yet)."""
    folder = Path(os.path.abspath(folder))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return -1


def check_space(folder: str | os.PathLike, needed: int, what: str = "the results") -> None:
    """Refuse, before any work, a folder whose file system has less than ``needed`` bytes free.

    A file system that does not say (``free_space`` is -1) passes: the writes themselves
    still fail cleanly."""
    free = free_space(folder)
    if 0 <= free < needed:
        raise ProbeError(
            f"not enough space in {folder}: {what} need about {_size(needed)}, "
            f"{_size(free)} free; free some space or write elsewhere"
        )


def _size(count: int) -> str:
    if count < 0:
        return "an unknown amount"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"
