"""The record of a Fastformer training run: ``training.json``, read back and as a Dataset.

``probe.fastformer.train.train`` writes ``training.json`` (``TRAINING_FILE``) into
every folder it trains: the command line, the data's sha256, the settings, the final
validation bits per character and the curves.  ``read_training`` reads one back,
checked field by field (a damaged record is refused in one line, never half used), and
``curves`` puts several side by side as one xarray Dataset (dims model, step), the
input of the training report (probe.reports.training).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xarray as xr

from probe.files.results import utc_now, versions

from ..errors import ProbeError

TRAINING_FILE = "training.json"


def read_training(folder: str | Path) -> dict:
    """The ``training.json`` of a folder written by :func:`train`, checked field by field."""
    path = Path(folder) / TRAINING_FILE
    if not path.is_file():
        raise ProbeError(
            f"{folder} has no {TRAINING_FILE}: not a folder written by `probe fastformer train`"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ProbeError(f"{path} is damaged ({_short(err)}); train again") from None
    problem = _record_problem(record)
    if problem:
        raise ProbeError(f"{path} is damaged ({problem}); train again")
    return record


_CURVE_PAIRS = (
    ("steps", "seconds", "train_loss"),
    ("eval_steps", "eval_seconds", "val_bits_per_char"),
)


def _record_problem(record) -> str:
    """What is wrong with a training record, or "" (the fields the report reads)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for key, kind in (("model", str), ("command", str), ("data", dict), ("settings", dict),
                      ("curve", dict), ("parameters", int), ("final_val_bits_per_char", float)):  # fmt: skip
        value = record.get(key)
        ok = (
            isinstance(value, int | float) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind)
        )
        if not ok:
            return f"'{key}' is missing or not a {kind.__name__}"
    if not all(isinstance(record["data"].get(k), str) for k in ("source", "sha256")):
        return "'data' lacks its source or sha256"
    for keys in _CURVE_PAIRS:
        lists = [record["curve"].get(k) for k in keys]
        for key, values in zip(keys, lists, strict=True):
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            ):
                return f"curve '{key}' is not a non-empty list of numbers"
        if len({len(v) for v in lists}) != 1:
            return f"curves {', '.join(keys)} differ in length"
    return ""


def _short(err: BaseException) -> str:
    return " ".join(str(err).split())[:200]


def curves(records: list[dict]) -> xr.Dataset:
    """The training curves of several ``training.json`` records as one Dataset (dims model, step)."""
    names = [r["model"] for r in records]
    if len(set(names)) < len(names):  # two Fastformers side by side: tell them apart
        names = [f"{r['model']} ({r.get('folder', i)})" for i, r in enumerate(records)]
    if len(set(names)) < len(names):
        names = [f"{name} #{i + 1}" for i, name in enumerate(names)]
    steps = max(len(r["curve"]["steps"]) for r in records)
    evals = max(len(r["curve"]["eval_steps"]) for r in records)

    def padded(key, n):
        out = np.full((len(records), n), np.nan)
        for i, r in enumerate(records):
            values = r["curve"][key]
            out[i, : len(values)] = values
        return out

    ds = xr.Dataset(
        {
            "train_loss": (("model", "step"), padded("train_loss", steps)),
            "seconds": (("model", "step"), padded("seconds", steps)),
            "eval_step": (("model", "evaluation"), padded("eval_steps", evals)),
            "eval_seconds": (("model", "evaluation"), padded("eval_seconds", evals)),
            "val_bits_per_char": (("model", "evaluation"), padded("val_bits_per_char", evals)),
            "final_val_bits_per_char": (
                ("model",),
                np.array([r["final_val_bits_per_char"] for r in records], dtype=np.float64),
            ),
            "parameters": (("model",), np.array([r["parameters"] for r in records], np.int64)),
        },
        coords={"model": names, "step": np.arange(1, steps + 1), "evaluation": np.arange(evals)},
    )
    ds["train_loss"].attrs["long_name"] = "training loss (nats per character)"
    ds["seconds"].attrs["long_name"] = "wall time since the start of training (s)"
    ds["val_bits_per_char"].attrs["long_name"] = "validation bits per character"
    ds["final_val_bits_per_char"].attrs["long_name"] = "validation bits per character at the end"
    ds["parameters"].attrs["long_name"] = "parameters of the model"
    first = records[0]
    ds.attrs = {
        "analysis": "training",
        "model": " vs ".join(names),
        "command": first["command"],
        "text_source": first["data"]["source"],
        "text_sha256": first["data"]["sha256"],
        "settings": json.dumps(first["settings"]),
        "folders": json.dumps(
            {n: r.get("folder", "") for n, r in zip(names, records, strict=True)}
        ),
        **versions(),
        "created": utc_now(),
    }
    return ds
