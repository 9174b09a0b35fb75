"""What a checkpoint stores, read from its tensors, not from its config.

transformers' ``dtype="auto"`` takes the config's ``dtype`` where the config names one, and
reads the files only where it does not: a float64 checkpoint whose config says float32 is
rounded to float32 as it is read, whatever precision the run asks for.  probe reads the
floating dtypes of the checkpoint's tensors from its files (a safetensors header, a torch
pickle's tensors on the meta device: no weight is read) and loads in the narrowest dtype
that holds every one of them exactly, so a float64 run reads float64 tensors as they are;
the run's dtype is applied afterwards, once.  The files are the ones transformers reads, in
its order of preference: ``model.safetensors`` (or its index's shards), then
``pytorch_model.bin`` (or its index's).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

import torch

#: safetensors' dtype codes of floating tensors, as torch names them.
SAFETENSORS_FLOATS = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
#: The largest header a safetensors file may have (the format's own limit).
HEADER_BYTES = 100_000_000
#: The weight files transformers reads, each with its index, in its order of preference.
WEIGHT_FILES = (
    ("model.safetensors.index.json", "model.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin"),
)


def stored_dtypes(location, revision=None, hub: dict | None = None) -> Counter | None:
    """dtype name -> how many floating tensors the checkpoint at ``location`` (a folder, or a
    hub id's files in the local cache) holds in it; None where its weight files cannot be
    found or read (transformers then decides, from the config)."""
    for index, single in WEIGHT_FILES:
        files = _files(location, index, single, revision, hub or {})
        if files:
            try:
                return sum((_dtypes(path) for path in files), Counter())
            except Exception:  # a file transformers will refuse with its own reason
                return None
    return None


def _files(location, index: str, single: str, revision, hub: dict) -> list[Path]:
    found = _file(location, index, revision, hub)
    if found is not None:
        try:
            shards = sorted(
                set(json.loads(found.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []
        paths = [_file(location, shard, revision, hub) for shard in shards]
        return [] if None in paths else paths  # type: ignore[return-value]
    found = _file(location, single, revision, hub)
    return [] if found is None else [found]


def _file(location, name: str, revision, hub: dict) -> Path | None:
    if isinstance(location, Path):
        path = location / name
        return path if path.is_file() else None
    from transformers.utils import cached_file

    try:
        found = cached_file(
            str(location), name, revision=revision, _raise_exceptions_for_missing_entries=False,
            **hub,
        )  # fmt: skip
    except (OSError, ValueError):
        return None
    return None if found is None else Path(found)


def _dtypes(path: Path) -> Counter:
    if path.suffix == ".safetensors":
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > min(path.stat().st_size - 8, HEADER_BYTES):  # not a safetensors file
                raise ValueError(f"{path.name}: a header of {length} bytes")
            header = json.loads(handle.read(length))
        codes = [v["dtype"] for k, v in header.items() if k != "__metadata__"]
        return Counter(SAFETENSORS_FLOATS[c] for c in codes if c in SAFETENSORS_FLOATS)
    state = torch.load(path, map_location="meta", weights_only=True, mmap=True)
    return Counter(
        str(t.dtype).removeprefix("torch.")
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    )


def holding(dtypes: Counter) -> torch.dtype | None:
    """The narrowest dtype that holds every stored dtype exactly: the one dtype stored, the
    widest of several where it is 32 bits or more, else float32 (which holds float16,
    bfloat16 and the float8s); None for no floating tensor."""
    if not dtypes:
        return None
    kinds = [getattr(torch, name) for name in dtypes]
    if len(kinds) == 1:
        return kinds[0]
    widest = max(kinds, key=lambda d: torch.finfo(d).bits)
    return widest if torch.finfo(widest).bits >= 32 else torch.float32


def described(dtypes: Counter) -> str:
    """``float64``; mixed, each with its count, widest first: ``float64 (3 tensors) and
    float32 (12 tensors)``."""
    if len(dtypes) == 1:
        return next(iter(dtypes))
    ordered = sorted(dtypes, key=lambda name: (-torch.finfo(getattr(torch, name)).bits, name))
    return " and ".join(f"{name} ({dtypes[name]} tensors)" for name in ordered)
