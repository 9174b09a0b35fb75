"""ProbedModel: a loaded model and what probe knows about it (family, weights, placement).

Every analysis takes one.  It holds the user's module untouched, the family's adapter,
where the weights came from, and how traces run: the nnsight wrapper, built once, and
for a remote model nnsight's hosted wrapper and ``remote=`` option.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from ..models import Adapter
from .audit import INCOMPLETE
from .placement import input_device


@dataclass
class ProbedModel:
    """A loaded HF base model and what probe knows about it; every analysis takes one.

    Made by [`probe.load`][probe.loading.load] and [`probe.wrap`][probe.loading.wrap]
    rather than built by hand.

    Parameters
    ----------
    name
        The model as results name it.
    model
        The user's module; probe only reads it inside traces.
    adapter
        The family's adapter: where the layers are and how a run walks and ablates them.
    init
        `pretrained` or `random`.
    seed
        The seed of the random init and the synthetic inputs.
    weights
        Where the weights came from, in words (and what a checkpoint lacked).
    tokenizer
        The tokenizer, or None (the model then reads seeded random ids).
    source
        Where the files came from, in words.
    checkpoint
        What identifies the checkpoint beyond its name (`probe.loading.identity`): a local
        folder's resolved path and fingerprint, a hub revision; empty for probe's own.
    remote
        `True` (NDIF) or `"local"` (nnsight's local simulation of it): traces run there.
    """

    name: str
    model: torch.nn.Module
    adapter: Adapter
    init: str
    seed: int
    weights: str
    tokenizer: Any = None
    source: str = ""
    #: What identifies the checkpoint beyond its name (:mod:`probe.loading.identity`): a
    #: local folder's resolved path and fingerprint, a hub revision; empty for probe's own.
    checkpoint: dict = field(default_factory=dict)
    _envoy: Any = field(default=None, repr=False)
    #: ``True`` (NDIF) or ``"local"`` (nnsight's local simulation of it): traces run there.
    remote: bool | str = False
    #: The nnsight wrapper of the whole hosted model (a ``TransformersModel``) when remote:
    #: traces start from it, and the walker from its base model (``root.base_model``).
    _hosted: Any = field(default=None, repr=False)
    #: An image family's processor: the checkpoint's own, else ViT's default for its size.
    _image_processor: Any = field(default=None, repr=False)

    @property
    def image_processor(self):
        if self._image_processor is None and self.adapter.inputs == "pixels":
            from transformers import ViTImageProcessorPil

            size = self.config.image_size
            channels = self.config.num_channels  # ViT's default mean and std are for RGB
            spread = (
                {}
                if channels == 3
                else {"image_mean": [0.5] * channels, "image_std": [0.5] * channels}
            )
            self._image_processor = ViTImageProcessorPil(
                size={"height": size, "width": size}, **spread
            )
        return self._image_processor

    @property
    def incomplete(self) -> bool:
        """Loaded with `allow_missing_weights=True` from a checkpoint that lacked tensors."""
        return INCOMPLETE in self.weights

    @property
    def family(self) -> str:
        return self.adapter.family

    @property
    def config(self):
        return self.model.config

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers(self.config)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the first parameter's device, or for a model spread by a
        `device_map` the device its embeddings run on (accelerate's hooks move every
        module's inputs to its own device from there); the CPU for a model on NDIF."""
        if self.remote is True:  # inputs are serialized from the host; the weights are on NDIF
            return torch.device("cpu")
        spread = getattr(self.model, "hf_device_map", None)
        if spread:
            return input_device(spread)
        return next(self.model.parameters()).device

    @property
    def device_map(self) -> dict | None:
        """accelerate's placement of the modules (`{module: device}`), or None if not spread."""
        return getattr(self.model, "hf_device_map", None)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def attn_implementation(self) -> str:
        """The attention that runs: HF's `eager`, or `probe_eager` (float64 kept, see
        `probe.models.attention`)."""
        from ..models.attention import ran

        return ran(self.model)

    @property
    def tracer_root(self):
        """The envoy whose ``.trace`` runs the model: the hosted model's wrapper when remote."""
        return self.envoy if self._hosted is None else self._hosted

    @property
    def trace_options(self) -> dict:
        """Keyword arguments of every trace: `remote=` for a remote model."""
        return {"remote": self.remote} if self.remote else {}

    @cached_property
    def envoy(self):
        """The nnsight wrapper, built once: it installs controllers that are inert outside a trace."""
        from nnsight import NNsight

        if self._hosted is not None:  # the base model inside the hosted LM, as NDIF serves it
            envoy = getattr(self._hosted, self._hosted._module.base_model_prefix)
            install = getattr(self.adapter, "install", None)
            if install is not None:
                install(envoy)
            return envoy
        with warnings.catch_warnings():
            # BERT's submodules called `output` are served as `.E_output`; the
            # adapter knows, the user need not be told on every load.
            warnings.filterwarnings("ignore", message=".*has a submodule named 'output'.*")
            envoy = NNsight(self.model)
        install = getattr(self.adapter, "install", None)
        if install is not None:  # operation-level sites, built before any trace
            install(envoy)
        return envoy
