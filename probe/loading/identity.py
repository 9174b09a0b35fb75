"""What a result measured: a checkpoint's identity, independent of how its name was typed.

A result file is named by a hash of its settings (:func:`probe.files.results.settings_id`).  For a
local ``save_pretrained`` folder the name as typed (``./m``) says nothing about the weights:
two projects' ``./m`` are two checkpoints, and a folder retrained in place is a new one.
So a local folder is identified by its resolved path and a fingerprint of its contents: a
sha256 over every file's name, size and *every byte* (config, tokenizer, index files and
weight files alike), so that any byte of a weight file that changes gives another
fingerprint, hence another result id and other cached theory constants.  No modification time
enters: a copy of a folder is the same checkpoint, and touching a file changes nothing.
The files are hashed in parallel, one a thread (hashlib releases the GIL): on the project's
2-core machine a 1 GiB weight file takes about 0.8 s (sha256 with the CPU's SHA extensions;
docs/robustness.md gives the measurement).

A module the caller passes (``probe.wrap``) has no folder: it is identified by
:func:`module_fingerprint`, the same hash over its parameters and buffers (names, dtypes,
shapes, and every byte of each), so two modules of one class with other weights never share
a result file.

A hub id is identified by its name and, for pretrained weights from the local cache, the
revision (the commit) the files came from.  Probe's own checkpoints (``minilm``, the shipped
``fastformer-tiny`` and ``gpt2-tiny``) and the configs bundled with it are identified by their
name: they change only with probe's version, which every result records.
The step folders of a checkpoint series (the shipped ``gpt2-tiny-steps`` included) are
given as folders, so each is a local folder with a fingerprint of its own: every step of a
training run is a distinct checkpoint.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import ProbeError, one_line

#: The block a file is read in.
BLOCK_BYTES = 2**20


def file_digest(path: Path) -> bytes:
    """sha256 of every byte of ``path``."""
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(BLOCK_BYTES), b""):
            hasher.update(block)
    return hasher.digest()


def folder_fingerprint(folder: str | os.PathLike) -> str:
    """A sha256 (hex) of a checkpoint folder's files: their names, sizes and contents (above).

    Only the folder's own files count (not its subfolders: transformers reads none), hidden
    files excepted.  Two folders with the same files give the same fingerprint wherever
    they are; any change to a weight, the config or the tokenizer gives another.
    """
    files = [
        path
        for path in sorted(Path(folder).iterdir())
        if not path.name.startswith(".") and path.is_file()
    ]
    with ThreadPoolExecutor(max_workers=max(1, min(len(files), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(file_digest, files))
    hasher = hashlib.sha256()
    for path, digest in zip(files, digests, strict=True):
        hasher.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        hasher.update(digest)
    return hasher.hexdigest()


def module_fingerprint(model) -> str:
    """A sha256 (hex) of a module's parameters and buffers, as :func:`folder_fingerprint`
    hashes files: each tensor's name, dtype and shape, and every byte of it.  A tensor on the
    meta device (offloaded by a device map) counts by its name, dtype and shape only."""
    import torch

    hasher = hashlib.sha256()
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]
    for name, tensor in named:
        hasher.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        data = tensor.detach().reshape(-1).cpu().contiguous().view(torch.uint8)
        hasher.update(memoryview(data.numpy()))
    return hasher.hexdigest()


def checkpoint_identity(location, where: str, config, pretrained: bool) -> dict[str, str]:
    """The attributes that identify a checkpoint (empty for probe's own and bundled ones).

    ``location``, ``where``: as :func:`probe.loading.resolve.locate` gives them; ``config``:
    the config read from there; ``pretrained``: whether its weights were read.
    """
    if isinstance(location, Path) and where.startswith("local folder"):
        try:
            fingerprint = folder_fingerprint(location)
        except OSError as err:
            raise ProbeError(f"cannot read the checkpoint {location}: {one_line(err)}") from None
        return {
            "checkpoint_path": str(location.resolve()),
            "checkpoint_fingerprint": fingerprint,
        }
    revision = getattr(config, "_commit_hash", None)
    if isinstance(location, str) and pretrained and revision:
        return {"checkpoint_revision": str(revision)}
    return {}
