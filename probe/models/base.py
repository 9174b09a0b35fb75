"""What every family adapter provides.

An adapter is the only place that knows a family's module paths.  Inside an
nnsight trace it walks the layers in forward order, writes the ablation as
interventions on that layer, and hands out the residual stream after it, always
batch-first ``(batch, token, hidden)``.  Nothing here replaces a module or
patches code: interventions live only as long as the trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from probe.surgery.ablate import Ablation

#: Families whose position ids start after the padding index (RobertaEmbeddings).
POSITIONS_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert")


class Adapter:
    """Base class: a family whose layers form a list, each called once.

    A family adapter is the only place that knows a family's module paths.  Inside an
    nnsight trace it walks the layers in forward order, writes an
    [`Ablation`][probe.surgery.ablate.Ablation] as interventions on each layer and hands out the
    residual stream after it, always batch-first (batch, token, hidden).  A loaded model's
    adapter is [`ProbedModel.adapter`][probe.loading.ProbedModel], chosen by its
    `config.model_type`.
    """

    #: Family name used everywhere (dims, file names, reports).
    family: ClassVar[str]
    #: ``config.model_type`` values this adapter accepts.
    model_types: ClassVar[tuple[str, ...]]
    #: Rows of the docstring table, kept as data for reports and result attrs.
    table: ClassVar[tuple[dict[str, str], ...]]
    #: What ``--surgery paper`` does in this family, next to probe's definition.
    paper_surgery: ClassVar[str] = "the paper's surgery is probe's definition in this family"
    #: Child modules of the base model that no probe computation reads: tensors missing
    #: from a checkpoint there are allowed (a BERT checkpoint of a task model has no pooler).
    unused_modules: ClassVar[tuple[str, ...]] = ()
    #: What "the residual stream after layer l" is in this family (post-LN families
    #: expose the normalised layer output, not the pre-LN sum).
    stream_note: ClassVar[str] = (
        "X_l is layer l's output after its final LayerNorm (post-LN); X_0 the first layer's input"
    )
    #: Extra keyword arguments for the model's forward.
    forward_kwargs: ClassVar[dict[str, Any]] = {}
    #: What a model of this family reads: token ``ids`` or image ``pixels``.
    inputs: ClassVar[str] = "ids"
    #: Whether a token attends only to itself and the tokens before it (decoders).
    causal: ClassVar[bool] = False

    def model_inputs(self, data: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        """Keyword arguments of the model's forward for one batch (ids or pixels, and its mask)."""
        if self.inputs == "pixels":
            return {"pixel_values": data, **self.forward_kwargs}
        return {"input_ids": data, "attention_mask": mask, **self.forward_kwargs}

    # --- configuration (HF's attribute_map gives every family these names) ------------
    def n_layers(self, config) -> int:
        return config.num_hidden_layers

    def n_heads(self, config) -> int:
        return config.num_attention_heads

    def hidden_size(self, config) -> int:
        return config.hidden_size

    def max_tokens(self, config) -> int | None:
        """Longest sequence the position embeddings allow (None: no limit).

        RoBERTa's embeddings number positions from ``padding_idx + 1`` (fairseq's
        ``make_positions``), so ``padding_idx + 1`` rows of the table are never a real
        token's.  ALiBi (Falcon with ``alibi``; BLOOM has no table) adds a bias that grows
        with distance: no limit.  Rotary families keep the trained context as their limit
        (nothing indexes past it, but nothing was trained there either); a ``linear`` or
        ``dynamic`` rope scaling stretches it by its ``factor`` (the other rope types state
        the stretched length in ``max_position_embeddings`` itself).
        """
        if getattr(config, "alibi", False):
            return None
        limit = getattr(config, "max_position_embeddings", None)
        if not isinstance(limit, int) or isinstance(limit, bool):
            return None
        if getattr(config, "model_type", None) in POSITIONS_AFTER_PADDING:
            pad = getattr(config, "pad_token_id", None)
            return limit - (pad if isinstance(pad, int) else 0) - 1
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in (
            "linear",
            "dynamic",
        ):
            factor = rope.get("factor")
            if isinstance(factor, int | float) and factor >= 1:
                return int(limit * factor)
        return limit

    def check(self, config) -> None:
        """Raise ProbeError for configurations this adapter cannot trace."""

    # --- inside a trace -------------------------------------------------------------
    def layers(self, root) -> Any:
        raise NotImplementedError

    def ablate(self, layer, ablation: Ablation) -> None:
        """Write ``ablation`` as interventions on one layer (forward order)."""
        raise NotImplementedError

    def layer_output(self, layer) -> torch.Tensor:
        return layer.output

    def batch_first(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def stream(self, root, tracer, ablation: Ablation) -> Iterator[torch.Tensor]:
        """Residual stream X_0 .. X_L, each (batch, token, hidden), under ``ablation``.

        X_0 is the first layer's input (the embeddings' output in the residual
        space); X_l the output of layer l.  Reads happen in forward order, as
        nnsight requires.
        """
        layers = self.layers(root)
        yield self.batch_first(first(layers[0].input))
        for layer in layers:
            if not ablation.is_identity:
                self.ablate(layer, ablation)
            yield self.batch_first(first(self.layer_output(layer)))

    # --- attention paths (probe.analyses.paths) ---------------------------------------
    #: Where the LayerNorm frozen by the path decomposition sits: "post" (LN(x + heads))
    #: or "pre" (x + heads(LN(x))).
    norm_position: ClassVar[str] = "post"

    #: Why the exact path-length decomposition does not apply to this family ("": it does).
    not_decomposable: ClassVar[str] = ""

    def path_heads(self, config) -> int:
        """Token-mixing matrices per layer that a sampled path chooses from (default: the heads)."""
        return self.n_heads(config)

    def attention_probs(self, layer) -> torch.Tensor:
        """Attention probabilities (batch, head, query token, key token) of one layer call."""
        raise NotImplementedError

    def norm_input(self, layer) -> torch.Tensor:
        """Input (batch, token, hidden) of the LayerNorm the decomposition freezes."""
        raise NotImplementedError

    def paths_layer(self, layer, ablation: Ablation, norms: bool) -> dict[str, torch.Tensor]:
        """Reads of one layer in forward order (attention, then its LayerNorm), then the ablation."""
        reads = {"attn": self.attention_probs(layer)}
        reads["norm_input"] = self.norm_input(layer) if norms else None
        if not ablation.is_identity:
            self.ablate(layer, ablation)
        return reads

    def paths_stream(
        self, root, tracer, ablation: Ablation, norms: bool = True, masks: bool = False
    ):
        """``{"x": X_0}``, then per layer ``{"attn", "norm_input", "x": X_l}``, in forward order;
        with ``masks``, also ``"mask"``, the mask the layer's attention function received,
        where the family calls one (:func:`probe.surgery.masks.seen`; none here)."""
        layers = self.layers(root)
        yield {"x": self.batch_first(first(layers[0].input))}
        for layer in layers:
            reads = self.paths_layer(layer, ablation, norms)
            reads["x"] = self.batch_first(first(self.layer_output(layer)))
            yield reads

    def layer_weights(self, model, index: int) -> LayerWeights:
        """The attention sublayer's parameters of layer ``index`` (outside any trace)."""
        raise NotImplementedError

    def final_norm(self, model) -> tuple[torch.Tensor, torch.Tensor, float, str] | None:
        """(gamma, beta, eps, kind) of a final norm that is part of the output, if any."""
        return None

    def final_output(self, model, x: torch.Tensor) -> torch.Tensor:
        """That final norm on the last layer's output, as the model computes it."""
        raise NotImplementedError

    def lm_head(self, model) -> torch.Tensor | None:
        """(vocab, hidden) weight of a language-model head the base model holds, if any."""
        return None


def first(value):
    """A layer's hidden states, whether it returns a tensor or a tuple."""
    return value[0] if isinstance(value, tuple | list) else value


def table_markdown(rows) -> str:
    """The adapter's table as Markdown, for docstrings and the CLI."""
    lines = ["| ablation | probe | paper's surgery |", "|---|---|---|"]
    lines += [f"| {r['ablation']} | {r['probe']} | {r['paper']} |" for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class LayerWeights:
    """The parameters of one attention sublayer, written per head.

    Head h maps x (token, hidden) to ``A_h (x W_v[h] + b_v[h]) W_o[h]``; the sublayer adds
    ``b_o``; its norm (``gamma``, ``beta``, ``eps``, of ``kind``) sits where ``norm`` says.
    Grouped-query attention is written per query head (each key/value head repeated).
    """

    w_v: torch.Tensor  # (head, hidden, head_dim)
    b_v: torch.Tensor  # (head, head_dim)
    w_o: torch.Tensor  # (head, head_dim, hidden)
    b_o: torch.Tensor  # (hidden,)
    gamma: torch.Tensor  # (hidden,)
    beta: torch.Tensor  # (hidden,)
    eps: float
    norm: str  # "post" or "pre"
    #: "layernorm" (centred), "rms" (not centred, no beta) or "none" (no norm at all).
    kind: str = "layernorm"
    #: A norm on the heads' output before the residual sum (Gemma2's post_attention_layernorm).
    branch_gamma: torch.Tensor | None = None
    branch_eps: float = 0.0
    branch_kind: str = ""


def linear_heads(value, dense, heads: int) -> tuple[torch.Tensor, ...]:
    """(w_v, b_v, w_o, b_o) from nn.Linear value and output projections (y = x W^T + b)."""
    hidden = value.weight.shape[1]
    w_v = value.weight.detach().T.reshape(hidden, heads, -1).permute(1, 0, 2)  # (head, hidden, d)
    b_v = value.bias.detach().reshape(heads, -1)  # (head, d)
    w_o = dense.weight.detach().T.reshape(heads, -1, dense.weight.shape[0])  # (head, d, hidden)
    return w_v, b_v, w_o, dense.bias.detach()
