"""Data-parallel runs under torchrun: each rank probes a contiguous share of the batches.

The collapse analysis is embarrassingly parallel over sequences: a sequence's metrics
depend on that sequence and the model only (Section 4's r_l, effective rank, ... are
per-sequence reductions of X_l).  So a corpus too long for one process is split, not
re-engineered:

* ``torchrun --nproc-per-node N -m probe.cli collapse ...`` starts N copies of the
  command.  Each loads the model (random init is drawn from the seed, so every rank has the
  same weights), makes the same inputs, and runs only its :func:`shard` of the *batches*:
  a contiguous run of whole batches, so every forward pass is exactly one the
  single-process run makes, and the numbers are equal bit for bit, whatever the world size.
* Each rank streams its results into its own netCDF file (:class:`probe.files.stream.SequenceWriter`)
  with the *global* sequence numbers of its sequences.
* The ranks then exchange one small status object each (:func:`gather`, over the process
  group torchrun sets up: gloo on CPUs, gloo for these objects plus nccl where the ranks
  hold GPUs; several nodes when torchrun spans them).  If any rank failed, every rank
  fails, rank 0 prints that rank's one-line error, and nothing is published.
* Otherwise rank 0 opens the shards with xarray's own multi-file machinery
  (:func:`merge`: ``xarray.open_mfdataset``, dask-backed and lazy, concatenated along
  ``sequence`` in rank order) and writes the one result and its report.

Why netCDF shards and ``open_mfdataset`` rather than zarr region writes: probe's result
format is netCDF-4 (``probe.files.results``), and a shard in that same format is a complete
result on its own (readable with ``probe.open_result`` for debugging); streaming into it is
what a single-process run already does.  ``open_mfdataset`` concatenates the shards lazily,
and ``to_netcdf`` then writes the one result chunk by chunk, so rank 0 never holds the whole
corpus.  Zarr region writes would need a store pre-sized by one rank before the others
write, a second storage engine as a dependency, and a conversion to netCDF at the end
anyway.  The shards must sit on a file system every rank can see (the results' folder):
the usual case on one node, a shared file system across nodes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import xarray as xr

from probe.files.results import ENGINE, SHARDS

from .errors import ProbeError


@dataclass(frozen=True)
class World:
    """Where this process stands in a torchrun job (rank 0 of 1 outside one)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    #: started by torchrun (its variables are set), even as a job of one process
    launched: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        """A torchrun job, of any size: it sets up its process group, streams shards and
        merges them, as one of several ranks would."""
        return self.size > 1 or self.launched


def world() -> World:
    """The job this process is part of, read from torchrun's environment variables."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise ProbeError(
            "WORLD_SIZE, RANK and LOCAL_RANK must be integers (torchrun sets them)"
        ) from None
    if size < 1 or not 0 <= rank < size:
        raise ProbeError(f"rank {rank} of a world of {size} processes makes no sense")
    return World(rank, size, local, launched="TORCHELASTIC_RUN_ID" in os.environ)


def shard(items: int, rank: int, size: int) -> tuple[int, int]:
    """The contiguous share [start, stop) of ``items`` that ``rank`` of ``size`` takes.

    Shares differ by at most one item, the first ranks taking the larger ones; in rank
    order they cover 0..items exactly once.  A rank may get none (more ranks than items).
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size}")
    base, extra = divmod(items, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def device_for(device: str | None, here: World) -> str | None:
    """``cuda`` becomes ``cuda:LOCAL_RANK`` in a parallel job: one GPU per rank."""
    if here.parallel and device == "cuda":
        return f"cuda:{here.local_rank}"
    return device


@contextlib.contextmanager
def process_group(here: World, device: str | None = None) -> Iterator[None]:
    """The torch.distributed process group of a torchrun job, torn down at the end.

    Only small Python objects travel between ranks (statuses and file names: the results
    go through the file system), so gloo carries them; where the ranks run on GPUs, nccl is
    set up beside it for CUDA tensors (``cpu:gloo,cuda:nccl``).
    """
    import torch.distributed as dist

    if not here.parallel or dist.is_initialized():
        yield
        return
    cuda = str(device or "").startswith("cuda")
    try:
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo")
    except Exception as err:  # no MASTER_ADDR, a port in use, ...
        raise ProbeError(
            f"cannot join the torchrun job as rank {here.rank} of {here.size}: "
            f"{' '.join(str(err).split())[:200]}; start it with torchrun --nproc-per-node N"
        ) from None
    try:
        if cuda:
            _check_nccl(here)
        yield
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _check_nccl(here: World) -> None:
    """Every rank's GPU joins one all-reduce over nccl before any work: a job whose GPUs
    cannot talk fails at the start, in one line, rather than after its forwards."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", here.local_rank)
    try:
        torch.cuda.set_device(device)
        count = torch.ones(1, device=device)
        dist.all_reduce(count)
        joined = int(count.item())
    except Exception as err:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        raise ProbeError(
            f"rank {here.rank}: the GPUs' nccl group failed on {device} "
            f"({' '.join(str(err).split())[:200]}); run with NCCL_DEBUG=INFO to see why"
        ) from None
    if joined != here.size:
        raise ProbeError(f"rank {here.rank}: {joined} of {here.size} GPUs joined the nccl group")


def gather(value, here: World) -> list:
    """Every rank's ``value``, in rank order, on every rank (``[value]`` alone)."""
    if not here.parallel:
        return [value]
    import torch.distributed as dist

    values: list = [None] * here.size
    try:
        dist.all_gather_object(values, value)
    except Exception as err:  # a rank died: its connection closed
        raise ProbeError(
            f"rank {here.rank}: lost contact with the other ranks "
            f"({' '.join(str(err).split())[:200]}); no result was written"
        ) from None
    return values


def broadcast(value, here: World):
    """Rank 0's ``value`` on every rank."""
    if not here.parallel:
        return value
    import torch.distributed as dist

    box = [value]
    try:
        dist.broadcast_object_list(box, src=0)
    except Exception as err:
        raise ProbeError(
            f"rank {here.rank}: lost contact with rank 0 "
            f"({' '.join(str(err).split())[:200]}); no result was written"
        ) from None
    return box[0]


def shard_folder(out_dir: Path, here: World) -> Path:
    """A fresh hidden folder in ``out_dir`` for this job's shards, the same on every rank.

    Rank 0 makes it and tells the others its name.  Each rank writes in a subfolder of its
    own, so that the clean-up of temporary files a run does on start (``results.clean_parts``,
    which checks process ids on this node only) never touches another node's shard.
    """
    folder = None
    if here.main:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        # Named by host and pid, so that a later run removes it if this job is killed
        # (results.clean_parts).
        prefix = f"{SHARDS}{socket.gethostname()}-{os.getpid()}-"
        folder = tempfile.mkdtemp(prefix=prefix, dir=out_dir)
    folder = Path(broadcast(folder, here))
    mine = folder / f"rank-{here.rank:05d}"
    mine.mkdir(parents=True, exist_ok=True)
    return folder


def shard_path(folder: Path, rank: int, index: int) -> Path:
    """Where ``rank`` streams its shard of the ``index``-th model of the command."""
    return folder / f"rank-{rank:05d}" / f"shard-{index:03d}.nc"


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def merge(shards: Sequence[str | os.PathLike], world_size: int) -> xr.Dataset:
    """The shards of one run as one lazy Dataset: ``xarray.open_mfdataset`` along ``sequence``.

    Shards are given in rank order; the ``sequence`` coordinate must then run 0, 1, ...
    without gaps or repeats (checked: a shard from another run cannot slip in).  Attributes
    are rank 0's, which describe the whole run (``sequences`` is the total), with
    ``world_size`` set.  The variables are dask arrays; ``to_netcdf`` writes them chunk by
    chunk.
    """
    import numpy as np

    paths = [str(p) for p in shards]
    ds = xr.open_mfdataset(
        paths,
        engine=ENGINE,
        combine="nested",
        concat_dim="sequence",
        data_vars="minimal",
        coords="minimal",
        compat="override",
        join="exact",
        combine_attrs="override",
        chunks={},
    )
    numbers = ds["sequence"].values
    if not np.array_equal(numbers, np.arange(numbers.size)):
        ds.close()
        raise ProbeError(
            "the shards do not number their sequences 0, 1, ... in rank order; "
            "they are not the shards of one run"
        )
    if numbers.size != int(ds.attrs.get("sequences", numbers.size)):
        ds.close()
        raise ProbeError(
            f"the shards hold {numbers.size} sequences, the run had {ds.attrs['sequences']}"
        )
    return _as_one_result(ds, world_size)


def _as_one_result(ds: xr.Dataset, world_size: int) -> xr.Dataset:
    """Merged shards as the single-process result has them, with ``world_size`` set."""
    import numpy as np

    # Attributes as Python numbers, not numpy's.
    ds.attrs = {
        key: value.item() if isinstance(value, np.generic) else value
        for key, value in ds.attrs.items()
    }
    ds.attrs["world_size"] = int(world_size)
    for variable in ds.variables.values():
        # The shards' on-disk layout (unlimited sequence dim, its chunking) is theirs;
        # the merged result gets netCDF's defaults.
        variable.encoding = {}
    return ds


def merge_parts(shards: Sequence[str | os.PathLike], world_size: int, name: str) -> xr.Dataset:
    """The parts of one run whose ``name`` variable each rank filled only where its share of
    the batches reached, NaN elsewhere (``paths.sample``: a sampled path belongs to
    the rank that holds its sequence).

    ``xarray.open_mfdataset`` stacks the parts along a new ``rank`` dimension; the reduction
    over ranks with NaN skipped takes, for each entry, the one value a rank computed.  Every
    other variable and coordinate is the same in all parts and is rank 0's.  Two ranks that
    both filled an entry are not parts of one run, and are refused.
    """
    import warnings

    paths = [str(p) for p in shards]
    parts = xr.open_mfdataset(
        paths,
        engine=ENGINE,
        combine="nested",
        concat_dim="rank",
        data_vars=[name],
        coords="minimal",
        compat="override",
        join="exact",
        combine_attrs="override",
    )
    try:
        stacked = parts[name]
        if int(stacked.notnull().sum("rank").max()) > 1:
            raise ProbeError(
                f"two shards both hold some of {name}: they are not the parts of one run"
            )
        with warnings.catch_warnings():  # an entry no rank filled stays NaN, as in one process
            warnings.simplefilter("ignore", RuntimeWarning)
            merged = stacked.max("rank", skipna=True).load()
        ds = parts.drop_vars(name).load()
    finally:
        parts.close()
    ds[name] = merged.assign_attrs(stacked.attrs)
    return _as_one_result(ds, world_size)
