"""Per-sequence results written as they come, so memory stays flat in the corpus.

A long run (say 100,000 sequences of a corpus) produces its results one batch at a time.
:class:`SequenceWriter` appends each batch's block to a netCDF-4 file whose ``sequence``
dimension is unlimited (HDF5 chunked storage, h5netcdf, the engine of
:mod:`probe.files.results`), so the host holds one batch of results, never the whole array.  The
file is the same netCDF a finished in-memory run saves: ``probe.open_result`` and xarray read
it as usual.

The skeleton (coordinates, attributes, empty variables) is written first, to a temporary
file beside the target (built in memory, written by Python), and HDF5 appends to it through
:class:`probe.files.results.Sink`, which keeps a failed write (a full disk) from HDF5: the writer
stops at the end of that step with one line and removes the file; variables without a ``sequence`` dimension that are known only once
the batches have run (the theory panel) are placeholders in it, filled in at the end.  The
target appears, by an atomic rename, only when every batch is in.  An interrupted or failed
run leaves no half-written result behind.

A shard of a data-parallel run (:mod:`probe.distributed`) starts at a global sequence
number ``first``: its ``sequence`` coordinate holds the numbers those sequences have in the
whole run, so shards concatenated in rank order are the single-process result.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import xarray as xr

from probe.files.results import ENGINE, netcdf_safe
from probe.files.staging import Sink, temp_beside, write_error

SEQUENCE = "sequence"
CHUNK_SEQUENCES = 256  # sequences per HDF5 chunk: appends touch few chunks, reads stay fast


class SequenceWriter:
    """Append blocks of sequences to a netCDF-4 result; see the module docstring.

    ``skeleton`` is a Dataset with every variable and coordinate of the result and a
    ``sequence`` dimension of length 0.  Use as a context manager: leaving it normally
    publishes the file, leaving it with an exception removes the partial file.
    ``first``: the global number of the first sequence appended (a shard's offset).
    """

    def __init__(self, path: str | os.PathLike, skeleton: xr.Dataset, first: int = 0) -> None:
        import h5netcdf

        if skeleton.sizes.get(SEQUENCE, None) != 0:
            raise ValueError("the skeleton must have an empty 'sequence' dimension")
        self.path = Path(path)
        # Named like every temporary file probe writes, so that a later run removes it only
        # once this process is gone (results.clean_parts); its mode follows the umask.
        self._tmp = Path(temp_beside(self.path))
        self.length = 0
        self.first = int(first)
        self._variables = [name for name in skeleton.variables if SEQUENCE in skeleton[name].dims]
        skeleton = skeleton.copy()
        skeleton.attrs = netcdf_safe(skeleton.attrs)
        encoding = {}
        for name in self._variables:
            dims = skeleton[name].dims
            encoding[name] = {
                "chunksizes": tuple(
                    CHUNK_SEQUENCES if dim == SEQUENCE else skeleton.sizes[dim] for dim in dims
                )
            }
        self._sink = None
        try:
            data = skeleton.to_netcdf(engine=ENGINE, unlimited_dims=[SEQUENCE], encoding=encoding)
            try:
                with open(self._tmp, "wb") as file:
                    file.write(data)
            except OSError as err:
                raise write_error(self.path, err) from None
            self._sink = Sink(self._tmp)
            self._file = h5netcdf.File(self._sink, "a")
        except BaseException:
            if self._sink is not None:
                self._sink.close()
            self._tmp.unlink(missing_ok=True)
            raise

    def append(self, block: dict[str, np.ndarray]) -> None:
        """Append ``block[name]`` (the variable's dims, ``sequence`` of the same length each)."""
        lengths = {
            np.shape(value)[self._file.variables[name].dimensions.index(SEQUENCE)]
            for name, value in block.items()
        }
        expected = set(self._variables) - {SEQUENCE}
        if len(lengths) != 1 or set(block) != expected:
            raise ValueError(
                f"a block needs each of {', '.join(sorted(expected))} once, all of one length"
            )
        (n,) = lengths
        start, stop = self.length, self.length + n
        self._file.resize_dimension(SEQUENCE, stop)
        for name, value in block.items():
            variable = self._file.variables[name]
            index = tuple(
                slice(start, stop) if dim == SEQUENCE else slice(None)
                for dim in variable.dimensions
            )
            variable[index] = value
        if SEQUENCE in self._file.variables:
            self._file.variables[SEQUENCE][start:stop] = self.first + np.arange(start, stop)
        self._sink.check()
        self.length = stop

    def set_attribute(self, name: str, value: str) -> None:
        """Set (or replace) a global attribute of the result before it is published: one
        known only once the batches have run."""
        self._file.attrs[name] = value
        self._sink.check()

    def fill(self, values: xr.Dataset) -> None:
        """Write variables without a ``sequence`` dimension, and attributes, known only once
        the batches have run (the theory panel).  Each variable is one of the skeleton's
        placeholders, of its dims and shape; its values are stored as the skeleton's
        encoding has them (a bool as netCDF's int8)."""
        for name, variable in values.data_vars.items():
            target = self._file.variables[name]
            if SEQUENCE in target.dimensions or variable.dims != target.dimensions:
                raise ValueError(f"{name} is not a placeholder of dims {variable.dims}")
            target[...] = np.asarray(variable.values).astype(target.dtype)
        for name, value in netcdf_safe(values.attrs).items():
            self.set_attribute(name, value)
        self._sink.check()

    def close(self) -> Path:
        """Finish the file and publish it at ``path``."""
        try:
            self._file.close()
            self._sink.check()
            self._sink.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        self._sink.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> SequenceWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
