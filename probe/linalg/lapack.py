"""Small dense eigenproblems on the host's LAPACK, split over the CPU's threads.

The products of probe.linalg (the Gram matrices, the Krylov steps, the passes over X) run on
X's device; the small dense eigenproblems -- Rayleigh-Ritz on each Krylov basis (at most
128 x 128), the quadrature's 20 x 20 tridiagonal matrices, the exact effective rank's k x k
Gram matrices -- go to the host's LAPACK through ``lapack``: on a CPU split over its threads,
from CUDA copied to the host, where they are faster than cuSOLVER's one-matrix-at-a-time
solvers.

On a CPU, torch hands LAPACK one small matrix at a time, and MKL threads each of those poorly:
a batch of eigenproblems is cut into one piece per thread and the pieces run in a small pool
whose threads each run LAPACK serially (``_serial_lapack``).  Every matrix is then solved
exactly as it would be alone, by the same serial code, so a result does not depend on the
batch it came in, the split or the number of threads: bit for bit (tests/test_linalg.py).
Accuracy is LAPACK's own: symmetric eigensolvers are backward stable, eigenvalues accurate to a
few eps of the matrix's norm.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

#: name prefix -> ((pid, threads) it was made for, the pool): see _pool.
_POOLS: dict[str, tuple[tuple[int, int], ThreadPoolExecutor]] = {}


def _pool(prefix: str, initializer) -> ThreadPoolExecutor | None:
    """The pool of as many threads as torch's intra-op setting whose threads are named
    ``prefix`` and set up by ``initializer``, made on first use; None in one of its own
    threads (work submitted again): a wait there on the pool could wait for itself, and the
    thread already runs serially."""
    if threading.current_thread().name.startswith(prefix):
        return None
    key = (os.getpid(), torch.get_num_threads())
    made = _POOLS.get(prefix)
    # A forked child inherits the pool object but none of its threads: it makes its own.
    if made is None or made[0] != key:
        pool = ThreadPoolExecutor(key[1], thread_name_prefix=prefix, initializer=initializer)
        made = _POOLS[prefix] = (key, pool)
    return made[1]


def lapack(fn, *problems: Tensor) -> list:
    """``[fn(P) for P in problems]`` for a batched LAPACK routine, split over the CPU's threads.

    On a CPU, torch hands LAPACK one small matrix at a time; each batch is cut into one piece
    per thread and the pieces run at once in a pool whose threads run LAPACK serially
    (``_serial_lapack``): on 2 cores, half the time of the plain batched call, a third of it
    when MKL would thread each small matrix itself.  Every matrix is solved exactly as it
    would be alone, so results do not depend on the split.  Problems on CUDA are solved on the
    host the same way and copied back: cuSOLVER batches only matrices up to 32 x 32 and
    solves larger ones one at a time, slower than the host's cores (the copies are k^2 per
    sequence, against the T H k of the Gram matrix the GPU formed).
    """
    device = problems[0].device
    if device.type != "cpu":
        host = lapack(fn, *(P.cpu() for P in problems))
        return [_to_device(result, device) for result in host]
    threads = torch.get_num_threads()
    # None in one of the pool's own threads (fn called lapack again): LAPACK runs serially.
    pool = _pool("probe-lapack", _serial_lapack) if threads > 1 else None
    if pool is None:
        return [fn(P) for P in problems]
    # Even a single matrix goes to the pool: every matrix is then solved by serial LAPACK,
    # whose rounding does not depend on the batch it came in or the number of threads.
    workers = min(threads, max(P.shape[0] for P in problems))
    futures = [[pool.submit(fn, piece) for piece in P.tensor_split(workers)] for P in problems]
    results = []
    for pending in futures:
        parts = [future.result() for future in pending]
        if isinstance(parts[0], Tensor):
            results.append(torch.cat(parts))
        else:
            results.append(tuple(torch.cat(pieces) for pieces in zip(*parts, strict=True)))
    return results


def _to_device(result, device: torch.device):
    if isinstance(result, Tensor):
        return result.to(device)
    return tuple(part.to(device) for part in result)


def _serial_lapack() -> None:
    # In each worker, MKL's LAPACK runs one thread per matrix: for matrices this small its
    # own threading costs more than it gains (2-3x slower on 2 cores), and the workers already
    # share the cores between them.  mkl_set_num_threads_local is MKL's per-thread setting,
    # exported by the x86 CPU builds of torch; torch.set_num_threads would change the whole
    # process.  Other builds (OpenBLAS) keep their defaults.
    try:
        library = ctypes.CDLL(
            os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        )
        library.mkl_set_num_threads_local(ctypes.byref(ctypes.c_int(1)))
    except (OSError, AttributeError):
        pass


def serial_threads() -> ThreadPoolExecutor | None:
    """A pool of as many threads as torch's intra-op setting, each of whose OpenMP thread count
    (which torch's intra-op parallelism reads, per thread) and MKL thread count (MKL's
    per-thread setting) are 1: torch's CPU work submitted to it runs serially in each thread,
    independent pieces side by side.

    For many small operations, where a thread pool's barriers cost more than they gain (and
    far more on a loaded machine: a descheduled thread delays only its own piece, not every
    operation's barrier).  torch.set_num_threads would do it for the whole process, and any
    call of it leaves MKL's batched LU in torch's CPU build (torch 2.13, oneMKL 2024.2)
    returning impossible pivots (``Parameter 6 was incorrect on entry to DLASWP``) for the rest
    of the process (reproduced with torch alone: ``torch.set_num_threads(2)``, then
    ``torch.linalg.lu_factor`` of a (4, 160, 160) float64 batch).  Settings that are not found
    (other builds) are left as they are: the work is then merely not serial.  Grad mode is
    per thread: what runs there sets its own.  None in one of these threads (``_pool``)."""
    return _pool("probe-serial", _one_thread)


def _one_thread() -> None:
    _serial_lapack()
    try:  # libgomp, which torch's Linux builds load for the whole process
        ctypes.CDLL(None).omp_set_num_threads(1)
    except (OSError, AttributeError):
        pass


def eigvalsh(*G: Tensor) -> list[Tensor]:
    """Eigenvalues of each batch of symmetric matrices, descending."""
    return [lam.flip(-1) for lam in lapack(torch.linalg.eigvalsh, *G)]
