"""How much memory a run will need, against what the device has: refuse what cannot fit.

Every command sizes its run before it allocates anything (``tokens=10000000000`` once
asked the allocator for 80 GB and died with a traceback).  The estimates are upper
bounds of the largest things a run holds at once, in bytes:

* weights: the parameter count (from a model built on the ``meta`` device: no memory,
  and the same construction transformers runs, so a config it rejects is refused
  here too) times the element size, float32 while loading;
* inputs: ids and mask, ``sequences x tokens`` int64 each;
* one forward pass: the residual stream and MLP activations
  (``batch x tokens x (hidden + intermediate)``) a few times over, the attention
  scores and probabilities (``batch x heads x tokens^2``), and the float64 copies the
  metrics make (``batch x tokens x hidden`` and ``batch x tokens^2``);

with the factors named beside each formula.  An estimate is compared with what the
device has free (``MemAvailable`` and the cgroup limit on Linux, free memory on a CUDA
device); where that cannot be read, nothing is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from probe.errors import ProbeError

#: Live copies of the residual stream and MLP activations in one eager forward pass
#: (input, attention output, LayerNorm outputs, MLP hidden and output, ...).
STREAM_COPIES = 6
#: Attention tensors of one layer held at once: scores, probabilities and the mask.
ATTENTION_COPIES = 3
#: float64 work buffers of the metrics per batch (probe.measures.metrics): X, R, their Grams.
METRIC_COPIES = 4


def fmt(n: float) -> str:
    """Bytes in words: 1.5 GB, 820 MB, 12 kB."""
    if n >= 1e15:
        return f"{n / 1e12:,.0f} TB"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def _cgroup_free() -> int | None:
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            cap = Path(limit).read_text().strip()
            used = int(Path(usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:
            return max(0, int(cap) - used)
    return None


def available(device: str = "cpu") -> int | None:
    """Bytes free on ``device`` now, or None where that cannot be read."""
    if str(device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    cgroup = _cgroup_free()
    if cgroup is not None:
        free = cgroup if free is None else min(free, cgroup)
    return free


def require(need: float, device: str, what: str, hint: str) -> None:
    """ProbeError if ``need`` bytes exceed what ``device`` has free.

    ``what`` names the run ("32 sequences of 128 tokens on bert"), ``hint`` what to
    change.  Also refused whatever the machine: more than 2^62 bytes, which no
    allocator can address.
    """
    free = available(device)
    if need >= 2**62 or (free is not None and need > free):
        have = f"{fmt(free)} are free on {device}" if free is not None else "no machine has that"
        raise ProbeError(f"{what} needs about {fmt(need)} of memory and {have}; {hint}")


# --- estimates ---------------------------------------------------------------------


def parameters(config) -> int:
    """The parameter count of the base model of ``config``, built on the meta device.

    Building is also the check that transformers accepts the config (heads dividing the
    width, known activation, ...): its error becomes a ProbeError naming the config.
    """
    import torch
    from transformers import AutoModel

    from probe.loading.quiet import quiet  # transformers' chatter while building

    try:
        with quiet(), torch.device("meta"):
            model = AutoModel.from_config(config, trust_remote_code=False)
    except Exception as err:  # ValueError, TypeError, AttributeError from a model's __init__
        text = " ".join(str(err).split())[:300]
        raise ProbeError(
            f"transformers cannot build a model from this config ({type(err).__name__}: {text}); "
            "fix config.json"
        ) from None
    return sum(p.numel() for p in model.parameters())


def forward_bytes(
    batch: int, tokens: int, hidden: int, heads: int, itemsize: int, intermediate: int = 0
) -> int:
    """One forward pass of one batch, with the metrics of one layer (module docstring)."""
    width = hidden + (intermediate or 4 * hidden)
    stream = STREAM_COPIES * batch * tokens * width * itemsize
    attention = ATTENTION_COPIES * batch * heads * tokens * tokens * itemsize
    metrics = METRIC_COPIES * batch * tokens * (hidden + tokens) * 8
    return stream + attention + metrics


def inputs_bytes(sequences: int, tokens: int) -> int:
    """Token ids and attention mask (int64 each)."""
    return 2 * 8 * sequences * tokens


def run_bytes(probed, sequences: int, tokens: int, batch: int) -> int:
    """Inputs plus one batch's forward pass and metrics of a loaded model (a ProbedModel)."""
    config, adapter = probed.config, probed.adapter
    intermediate = next(
        (
            getattr(config, key)
            for key in ("intermediate_size", "n_inner", "d_inner")
            if isinstance(getattr(config, key, None), int)
        ),
        0,
    )
    itemsize = probed.dtype.itemsize
    held = inputs_bytes(sequences, tokens)
    if getattr(adapter, "inputs", "ids") == "pixels":
        # An image model (ViT): the token count is the config's (patches and [CLS]), and
        # the inputs are float32 pixels, channels x size x size per image.
        size, patch = config.image_size, config.patch_size
        tokens = (size // patch) ** 2 + 1
        held = 4 * sequences * config.num_channels * size * size
    forward = forward_bytes(
        min(batch, sequences),
        tokens,
        adapter.hidden_size(config),
        adapter.n_heads(config),
        itemsize,
        intermediate,
    )
    return held + forward


def require_run(probed, sequences: int, tokens: int, batch: int, extra: int = 0) -> None:
    """``require`` for a run of ``probed`` on ``sequences`` x ``tokens`` in batches."""
    require(
        run_bytes(probed, sequences, tokens, batch) + extra,
        str(probed.device),
        f"{sequences} sequences of {tokens} tokens in batches of {min(batch, sequences)} "
        f"on {probed.name}",
        "use fewer `sequences`, `tokens` or a smaller `batch_size`",
    )
