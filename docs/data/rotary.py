"""How far transformers' float32 rotary cos/sin leave a float64 GPT-NeoX from a float64 one.

    python docs/data/rotary.py

transformers computes a rotary embedding's cos and sin in float32 and casts them to the
model's dtype, so even a float64 model rotates its queries and keys by float32 angles.
This runs a random-init GPT-NeoX (Pythia-160m's shape: 12 layers, width 768, 12 heads,
rotary on a quarter of each head; seed 0) in float64 on 2 sequences of 128 random token
ids, once as transformers computes it and once with the rotary cos/sin recomputed
in float64, and writes the largest absolute difference of the last hidden state (and that
difference relative to the state's largest entry) to ``docs/data/rotary.md`` (``docs/float64.md`` includes it).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPTNeoXConfig, GPTNeoXModel

HERE = Path(__file__).resolve().parent


def float64_rotary(module):
    """The forward of a GPT-NeoX rotary embedding with its angles in float64."""
    dim = module.inv_freq.numel() * 2
    base = module.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def forward(x, position_ids):
        freqs = position_ids[..., None].double() * inv_freq.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    return forward


def measure(seed: int = 0) -> tuple[float, float]:
    torch.manual_seed(seed)
    config = GPTNeoXConfig(
        vocab_size=512,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    model = GPTNeoXModel(config).double().eval()
    ids = torch.randint(
        0, config.vocab_size, (2, 128), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        as_written = model(ids).last_hidden_state
        model.rotary_emb.forward = float64_rotary(model.rotary_emb)
        wide = model(ids).last_hidden_state
    largest = float((as_written - wide).abs().max())
    return largest, largest / float(wide.abs().max())


def main() -> None:
    import platform
    from importlib import metadata

    largest, relative = measure()
    versions = f"torch {metadata.version('torch')}, transformers {metadata.version('transformers')}"
    line = (
        f"**{largest:.1e}** ({relative:.1e} of the largest entry; "
        f"`python docs/data/rotary.py`; {versions}; "
        f"{platform.machine()}, float64 throughout except the rotary angles).\n"
    )
    (HERE / "rotary.md").write_text(line, encoding="utf-8")
    print(line, end="")


if __name__ == "__main__":
    main()
