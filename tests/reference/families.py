"""Each model family's reference, one entry per family, read by every reference helper.

No ``probe`` imports, as the rest of ``tests/reference``.  A :class:`ReferenceEntry`
gathers what the independent oracles need to know about one family: its layer list,
the layer's re-implementation by module surgery (``reference/layers.py``: the skip and
MLP ablations), where the path oracle reads its attention (``reference/path_families.py``,
a :class:`Reference`) and the modules whose outputs are its attention and MLP branches
(``reference/branch_scale.py``).  The functions themselves live in those modules; this
one holds the table and the lookup.

:func:`entry_for` looks a model up by its ``config.model_type`` in :data:`ENTRIES`; a
model_type not there whose first layer is Llama-shaped (real submodules ``self_attn``,
``input_layernorm``, ``post_attention_layernorm`` and ``mlp``: Mistral, Qwen2/3, Gemma,
Phi3, Mixtral, Starcoder2, ...) gets :data:`LLAMA`; any other raises
:class:`NoReference`, inside the tests of that family only (the lookups run in the
tests, never at collection).

A new family is one entry in :data:`ENTRIES`, and none for a Llama-shaped layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from tests.reference import layers
from tests.reference import path_families as paths
from tests.reference.path_families import NoReference, Reference, cohere_norm, layer_norm, rms

__all__ = ["ENTRIES", "LLAMA", "NoReference", "ReferenceEntry", "entry_for", "llama_shaped"]


@dataclass(frozen=True)
class ReferenceEntry:
    """One family's reference.

    ``reference``: the path oracle's reads (its ``layers`` is the layer list's path, which
    every helper uses); ``layer``: the layer's re-implementation, ``layer(layer,
    hidden_states, *args, skip, mlp, **kwargs)``, or None where ``reference/surgery.py``
    re-implements the family (BERT, GPT-2, ALBERT, XLNet); ``branches``: the paths, from a
    layer, of the modules whose outputs are the attention branch and the MLP branch added
    to the residual stream, or None for a family outside branch scaling (ALBERT, XLNet).
    """

    reference: Reference
    layer: Callable | None = None
    branches: tuple[str, str] | None = None

    @property
    def layers(self) -> str:
        """The path of the layer list, from the model."""
        return self.reference.layers


_BERT_BRANCHES = ("attention.output.dense", "output.dense")  # dropout(dense(x)) before the sum
# Phi3's resid_attn_dropout / resid_mlp_dropout follow these: the identity in eval mode.
_LLAMA_BRANCHES = ("self_attn", "mlp")
_SANDWICH_BRANCHES = ("post_attention_layernorm", "post_feedforward_layernorm")  # last norms


def _bert_like(layer: Callable | None) -> ReferenceEntry:
    reference = Reference(
        "encoder.layer", "attention.self", 1, "attention.output.LayerNorm", paths._bert
    )
    return ReferenceEntry(reference, layer, _BERT_BRANCHES)


#: Llama's entry, and that of every Llama-shaped layer of a model_type not in ENTRIES.
LLAMA = ReferenceEntry(
    Reference(
        "layers", "self_attn", 1, "input_layernorm", paths._llama, paths._llama_final, decoder=True
    ),
    layers._llama,
    _LLAMA_BRANCHES,
)

#: Gemma 2's sandwich layer, Gemma 3's too.
_GEMMA2 = ReferenceEntry(
    Reference(
        "layers",
        "self_attn",
        1,
        "input_layernorm",
        paths._llama,
        paths._llama_final,
        branch="post_attention_layernorm",
        decoder=True,
    ),
    layers._gemma2,
    _SANDWICH_BRANCHES,
)

#: model_type -> its family's reference entry.
ENTRIES: dict[str, ReferenceEntry] = {
    "bert": _bert_like(None),  # its layer: reference/surgery.py
    "roberta": _bert_like(layers._bert_like),
    "electra": _bert_like(layers._bert_like),
    "albert": ReferenceEntry(
        Reference("encoder.albert_layer_groups.0.albert_layers", "attention", 1, "", paths._bert)
    ),
    "xlnet": ReferenceEntry(Reference("layer", "rel_attn", 1, "", paths._xlnet)),
    "deberta-v2": ReferenceEntry(
        Reference(
            "encoder.layer",
            "attention.self",
            1,
            "attention.output.LayerNorm",
            paths._deberta,
            kwargs={"output_attentions": True},  # the probabilities are returned only when asked
        ),
        layers._deberta,
        _BERT_BRANCHES,
    ),
    "distilbert": ReferenceEntry(
        Reference("transformer.layer", "attention", 1, "sa_layer_norm", paths._distilbert),
        layers._distilbert,
        ("attention", "ffn"),
    ),
    "gpt2": ReferenceEntry(  # its layer: reference/surgery.py
        Reference("h", "attn", 1, "ln_1", paths._gpt2, lambda m: layer_norm(m.ln_f), decoder=True),
        None,
        ("attn", "mlp"),
    ),
    "llama": LLAMA,
    "gemma2": _GEMMA2,
    "gemma3_text": _GEMMA2,  # Gemma3DecoderLayer's forward and reads are Gemma2's
    "gpt_oss": ReferenceEntry(LLAMA.reference, layers._gpt_oss, _LLAMA_BRANCHES),
    "phi": ReferenceEntry(
        Reference(
            "layers",
            "self_attn",
            1,
            "input_layernorm",
            paths._phi,
            lambda m: layer_norm(m.final_layernorm),
            decoder=True,
        ),
        layers._phi,
        ("self_attn", "mlp"),
    ),
    "gpt_bigcode": ReferenceEntry(
        Reference(
            "h", "attn", 1, "ln_1", paths._gpt_bigcode, lambda m: layer_norm(m.ln_f), decoder=True
        ),
        layers._gpt_bigcode,
        ("attn", "mlp"),
    ),
    "olmo2": ReferenceEntry(
        Reference(
            "layers",
            "self_attn",
            1,
            "",
            paths._olmo2,
            lambda m: rms(m.norm),
            branch="post_attention_layernorm",
            decoder=True,
        ),
        layers._olmo2,
        _SANDWICH_BRANCHES,
    ),
    "bloom": ReferenceEntry(
        Reference(
            "h",
            "self_attention",
            1,
            "input_layernorm",
            paths._bloom,
            lambda m: layer_norm(m.ln_f),
            decoder=True,
        ),
        layers._bloom,
        ("self_attention.dense", "mlp.dense_4h_to_h"),
    ),
    "opt": ReferenceEntry(
        Reference(
            "decoder.layers",
            "self_attn",
            1,
            "self_attn_layer_norm",
            paths._opt,
            paths._opt_final,
            decoder=True,
        ),
        layers._opt,
        ("self_attn", "fc2"),
    ),
    "gptj": ReferenceEntry(
        Reference("h", "attn", 1, "ln_1", paths._gptj, lambda m: layer_norm(m.ln_f), decoder=True),
        layers._gptj,
        ("attn", "mlp"),
    ),
    "falcon": ReferenceEntry(
        Reference(
            "h",
            "self_attention",
            1,
            paths._falcon_norm,
            paths._falcon,
            lambda m: layer_norm(m.ln_f),
            decoder=True,
        ),
        layers._falcon,
        ("self_attention", "mlp"),
    ),
    "gpt_neox": ReferenceEntry(
        Reference(
            "layers",
            "attention",
            1,
            "input_layernorm",
            paths._neox,
            lambda m: layer_norm(m.final_layer_norm),
            decoder=True,
        ),
        layers._neox,
        ("post_attention_dropout", "post_mlp_dropout"),
    ),
    "stablelm": ReferenceEntry(
        Reference(
            "layers",
            "self_attn",
            1,
            "input_layernorm",
            paths._stablelm,
            lambda m: layer_norm(m.norm),
            decoder=True,
        ),
        layers._stablelm,
        _LLAMA_BRANCHES,  # a dropout follows the MLP (both layouts)
    ),
    "cohere": ReferenceEntry(
        Reference(
            "layers",
            "self_attn",
            1,
            "input_layernorm",
            paths._cohere,
            lambda m: cohere_norm(m.norm),
            decoder=True,
        ),
        layers._cohere,
        _LLAMA_BRANCHES,
    ),
    # Llama-shaped, but an entry of its own: the residual multiplier (by which the layer
    # multiplies each branch, so alpha composes with it).
    "granite": ReferenceEntry(
        Reference(
            "layers",
            "self_attn",
            1,
            "input_layernorm",
            paths._granite,
            lambda m: rms(m.norm),
            decoder=True,
        ),
        layers._granite,
        _LLAMA_BRANCHES,
    ),
    "modernbert": ReferenceEntry(
        Reference(
            "layers", "attn", 1, "attn_norm", paths._modernbert, lambda m: layer_norm(m.final_norm)
        ),
        layers._modernbert,
        ("attn", "mlp"),
    ),
    "t5": ReferenceEntry(
        Reference(
            "encoder.block",
            "layer.0.SelfAttention",
            2,
            "layer.0.layer_norm",
            paths._t5,
            lambda m: rms(m.encoder.final_layer_norm),
        ),
        layers._t5,
        ("layer.0.SelfAttention", "layer.1.DenseReluDense"),
    ),
    "vit": ReferenceEntry(
        Reference(
            "layers",
            "attention",
            1,
            "layernorm_before",
            paths._vit,
            lambda m: layer_norm(m.layernorm),
        ),
        layers._vit,
        ("attention", "mlp"),
    ),
}

_LLAMA_SHAPE = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")


def llama_shaped(model: nn.Module) -> bool:
    """Whether ``model``'s first layer (in ``model.layers``) is Llama-shaped."""
    stack = getattr(model, "layers", None)
    # Submodules, not attributes: a parallel StableLM layer's post_attention_layernorm is None.
    return stack is not None and all(
        isinstance(getattr(stack[0], name, None), nn.Module) for name in _LLAMA_SHAPE
    )


def entry_for(model: nn.Module) -> ReferenceEntry:
    """The reference entry of ``model``'s family (see the docstring); :class:`NoReference`
    where it has none."""
    kind = model.config.model_type
    if kind in ENTRIES:
        return ENTRIES[kind]
    if llama_shaped(model):
        return LLAMA
    raise NoReference(
        f"no reference entry for model_type {kind!r} ({type(model).__name__}): add one to "
        "ENTRIES in tests/reference/families.py"
    )
