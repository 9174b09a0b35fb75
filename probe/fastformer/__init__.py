"""The Fastformer causal LM, the project's fifth family.

Importing this package registers ``FastformerConfig`` and
``FastformerForCausalLM`` with AutoConfig, AutoModel and AutoModelForCausalLM
under model_type ``"FastformerForCausalLM"``, so ``from_pretrained(folder)``
works for folders in the shared checkpoint format.  ``AutoModel`` gives the
causal LM itself: the family's module tree has no separate base model that
takes token ids.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .config import FastformerConfig
from .modeling import FastformerCache, FastformerForCausalLM
from .pooling import causal_pool, naive_causal_pool, pooling_weights

MODEL_TYPE = FastformerConfig.model_type


def _register() -> None:
    AutoConfig.register(MODEL_TYPE, FastformerConfig, exist_ok=True)
    AutoModel.register(FastformerConfig, FastformerForCausalLM, exist_ok=True)
    AutoModelForCausalLM.register(FastformerConfig, FastformerForCausalLM, exist_ok=True)


_register()

__all__ = [
    "MODEL_TYPE",
    "FastformerCache",
    "FastformerConfig",
    "FastformerForCausalLM",
    "causal_pool",
    "naive_causal_pool",
    "pooling_weights",
]
