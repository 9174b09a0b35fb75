"""The table of the shipped checkpoints in docs/fastformer.md, from their training records.

    python docs/data/fastformer_checkpoints.py

Reads ``training.json`` in each checkpoint folder shipped with probe (written by the
``probe fastformer train`` run that made it) and writes the checkpoint, its parameters,
its validation bits per character and its training time as Markdown to
``docs/data/fastformer_checkpoints.md``, which ``docs/fastformer.md`` includes.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKPOINTS = HERE.parents[1] / "probe" / "checkpoints"
KINDS = {"fastformer-tiny": "additive attention", "gpt2-tiny": "full attention (GPT-2)"}


def table() -> str:
    lines = [
        "| checkpoint | family | parameters | validation bits/char | training time |",
        "|---|---|---:|---:|---:|",
    ]
    for name, kind in KINDS.items():
        record = json.loads((CHECKPOINTS / name / "training.json").read_text())
        lines.append(
            f"| `{name}` | {kind} | {record['parameters']:,} | "
            f"{record['final_val_bits_per_char']:.3f} | {record['seconds']:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    text = table()
    (HERE / "fastformer_checkpoints.md").write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
