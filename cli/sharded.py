"""One rank of a torchrun job, for any command that splits its batches (see probe.distributed).

Every rank does its ``work`` into a shard folder all ranks share; the ranks then agree on
whether all of them succeeded.  Only then does rank 0 ``publish`` (merge the shards, write
the result and its report, the index) exactly as a single process would; the other ranks
print nothing.  Any failure on any rank fails every rank, with that rank's one line from
rank 0, and nothing is published.  The shard folder is removed in every case, and so is
every folder rank 0 made for it (``--out`` and its new parents) when nothing was published.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from probe import distributed
from probe.errors import ProbeError

from .console import fail, settings, warn
from .output import no_empty_folder


def run_sharded(
    here: distributed.World,
    out_dir: Path,
    work: Callable[[Path], None],
    publish: Callable[[Path], None],
) -> None:
    """``work(folder)`` on every rank, then ``publish(folder)`` on rank 0 if all succeeded."""
    if not here.main:
        settings["quiet"] = True
    # Only rank 0 makes folders (distributed.shard_folder): it removes those a failed or
    # interrupted job leaves empty.
    with no_empty_folder(out_dir) if here.main else contextlib.nullcontext():
        _run(here, out_dir, work, publish)


def _run(here, out_dir: Path, work, publish) -> None:
    folder = distributed.shard_folder(out_dir, here)
    try:
        status = _outcome(work, folder)
        statuses = distributed.gather(status, here)
        failed = [(rank, text) for rank, (state, text) in enumerate(statuses) if state != "ok"]
        if failed:
            rank, text = failed[0]
            if here.main:
                fail(f"rank {rank} of {here.size} failed, no result was written: {text}")
            raise SystemExit(2)
        outcome = _outcome(publish, folder) if here.main else ("ok", "")
        outcome = distributed.broadcast(outcome, here)
        if outcome[0] != "ok":
            if here.main:
                fail(outcome[1])
            raise SystemExit(2)
    finally:
        if here.main:
            distributed.remove(folder)


def _outcome(step: Callable[[Path], None], folder: Path) -> tuple[str, str]:
    """("ok", "") or ("error", one line): a bug or a device error is still one line."""
    try:
        step(folder)
    except ProbeError as exc:
        return ("error", str(exc))
    except Exception as exc:
        return ("error", f"{type(exc).__name__}: {exc}")
    return ("ok", "")


def rank_warn(here: distributed.World) -> Callable[[str], None]:
    """Warnings from rank 0 only: the other ranks would say the same."""
    return warn if here.main else _silent


def _silent(message: str) -> None:
    """Warnings of ranks other than 0."""
