"""What keying a checkpoint by every byte costs: the folder's fingerprint
(``probe.loading.identity.folder_fingerprint``, sha256 of every file) against the load it
comes with (``probe.load(folder, init="pretrained")``, the fingerprint included), on a
save_pretrained folder of about 1 GiB of float32 weights (GPT-2's architecture, 20 layers
of width 1024), in one or two safetensors shards.

    python benchmarks/fingerprint.py [--gib 1.0] [--repeats 3]

Prints the medians of interleaved runs (the files in the page cache after the first) and
the fingerprint's share of the load.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from timing import interleaved_medians

import probe
from probe.loading.identity import folder_fingerprint


def folder(where: Path, gib: float, shard: str) -> Path:
    from transformers import GPT2Config, GPT2Model

    width = 1024
    per_layer = 12 * width * width * 4  # bytes of one layer's float32 weights
    layers = max(1, round(gib * 2**30 / per_layer))
    config = GPT2Config(
        n_embd=width, n_layer=layers, n_head=16, vocab_size=2048, bos_token_id=0, eos_token_id=0
    )
    model = GPT2Model(config)
    target = where / f"gpt2-{layers}-{shard}"
    from transformers.utils import logging

    logging.disable_progress_bar()
    model.save_pretrained(target, max_shard_size=shard)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for shard in ("5GB", "600MB"):
            path = folder(Path(tmp), args.gib, shard)
            size = sum(f.stat().st_size for f in path.iterdir())
            files = len(list(path.glob("*.safetensors")))
            runs = {
                "fingerprint": lambda path=path: folder_fingerprint(path),
                "load": lambda path=path: probe.load(path, init="pretrained"),
            }
            medians = interleaved_medians(runs, args.repeats, cpu)
            print(
                f"{size / 2**30:.2f} GiB in {files} safetensors file(s): fingerprint "
                f"{medians['fingerprint']:.2f} s, load {medians['load']:.2f} s (the "
                f"fingerprint included): {medians['fingerprint'] / medians['load']:.0%} of it"
            )


if __name__ == "__main__":
    main()
