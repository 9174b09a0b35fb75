"""The Fastformer causal LM's configuration, as in the checkpoints its users have.

Field names and defaults are those of the shared checkpoint format (see
``FastformerConfig`` below); ``n_heads`` may be missing from older files and
then means 4.  HF's ``attribute_map`` gives the common names
(``num_attention_heads``) that probe's adapters read.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class FastformerConfig(PretrainedConfig):
    """Additive-attention (Fastformer) causal LM: sizes, convolution, dropout, init."""

    model_type = "FastformerForCausalLM"
    attribute_map = {"num_attention_heads": "n_heads"}

    hidden_size: int = 256
    vocab_size: int = 32100
    n_heads: int = 4
    max_position_embeddings: int = 1024
    num_hidden_layers: int = 4
    convolve: bool = False
    groups: int = 1
    kernel_size: int = 4
    hidden_dropout_prob: float | int = 0.1
    initializer_range: float = 0.02
    label_smoothing: float | int = 0
    pad_token_id: int | None = 0
    tie_word_embeddings: bool = True
    use_cache: bool = True

    def validate_sizes(self) -> None:
        """ValueError for sizes the layers cannot be built with."""
        if self.hidden_size % self.n_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads}"
            )
        if self.convolve and self.hidden_size % self.groups:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of groups {self.groups}"
            )
