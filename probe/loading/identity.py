"""What a result measured: a checkpoint's identity, independent of how its name was typed.

A result file is named by a hash of its settings (:func:`probe.files.results.settings_id`).  For a
local ``save_pretrained`` folder the name as typed (``./m``) says nothing about the weights:
two projects' ``./m`` are two checkpoints, and a folder retrained in place is a new one.
So a local folder is identified by its resolved path and a fingerprint of its contents:

* every small file (config, tokenizer, index files, small weight files) is hashed whole;
* a weight file over :data:`WHOLE_BYTES` is hashed by its size, its safetensors header
  (names, dtypes, shapes, offsets) and :data:`SAMPLES` evenly spaced blocks of its bytes.
  Retraining changes essentially every value, so a sampled block sees it, at a cost of a few
  MiB read per file whatever its size.  No modification time enters: a copy of a folder is
  the same checkpoint, and touching a file changes nothing.

A module the caller passes (``probe.wrap``) has no folder: it is identified by
:func:`module_fingerprint`, the same hash over its parameters and buffers (names, dtypes,
shapes, and their bytes, whole up to :data:`WHOLE_BYTES` a tensor, sampled above), so two
modules of one class with other weights never share a result file.

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
import struct
from pathlib import Path

from ..errors import ProbeError, one_line

#: Files hashed whole up to this size; larger ones by header, size and sampled blocks.
WHOLE_BYTES = 64 * 2**20
#: Blocks sampled from a large file, and their size.
SAMPLES = 16
BLOCK_BYTES = 2**16


def _file_digest(path: Path, size: int) -> bytes:
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        if size <= WHOLE_BYTES:
            for block in iter(lambda: handle.read(2**20), b""):
                hasher.update(block)
            return hasher.digest()
        hasher.update(b"sampled %d" % size)
        if path.suffix == ".safetensors":  # the header: names, dtypes, shapes, offsets
            (length,) = struct.unpack("<Q", handle.read(8))
            hasher.update(handle.read(min(length, WHOLE_BYTES)))
        for index in range(SAMPLES):
            handle.seek((size - BLOCK_BYTES) * index // (SAMPLES - 1))
            hasher.update(handle.read(BLOCK_BYTES))
    return hasher.digest()


def folder_fingerprint(folder: str | os.PathLike) -> str:
    """A sha256 (hex) of a checkpoint folder's files: their names, sizes and contents (above).

    Only the folder's own files count (not its subfolders: transformers reads none), hidden
    files excepted.  Two folders with the same files give the same fingerprint wherever
    they are; any change to a weight, the config or the tokenizer gives another.
    """
    hasher = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        size = path.stat().st_size
        hasher.update(f"{path.name}\0{size}\0".encode())
        hasher.update(_file_digest(path, size))
    return hasher.hexdigest()


def module_fingerprint(model) -> str:
    """A sha256 (hex) of a module's parameters and buffers, as :func:`folder_fingerprint`
    hashes files: each tensor's name, dtype and shape, and its bytes (whole up to
    :data:`WHOLE_BYTES`, else :data:`SAMPLES` evenly spaced blocks).  A tensor on the meta
    device (offloaded by a device map) counts by its name, dtype and shape only."""
    import torch

    hasher = hashlib.sha256()
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]
    for name, tensor in named:
        hasher.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        flat = tensor.detach().reshape(-1)
        size = flat.numel() * flat.element_size()
        if size <= WHOLE_BYTES:
            data = flat.cpu().contiguous().view(torch.uint8)
        else:  # the same sampled blocks a large file gets, taken on the tensor's device
            per = max(1, BLOCK_BYTES // flat.element_size())
            starts = [(flat.numel() - per) * i // (SAMPLES - 1) for i in range(SAMPLES)]
            data = torch.cat([flat[a : a + per] for a in starts]).cpu().view(torch.uint8)
        hasher.update(data.numpy().tobytes())
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
