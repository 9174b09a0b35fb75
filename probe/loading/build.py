"""The weights of a model: drawn at random from a seed, or read from its checkpoint.

:func:`random_model` draws the weights as transformers' own initialisation does, from
``seed`` and without touching the caller's RNG; the layers' default init, which that
initialisation overwrites anyway, is skipped (half the build time of a large model).
:func:`pretrained_model` reads a checkpoint and has :func:`~probe.loading.audit.check_loading`
audit what did not fit.  :func:`choose_attention` picks, for float64 models, the attention
and experts implementations that keep every operation in float64.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch

from probe.loading.quiet import quiet

from ..errors import ProbeError, one_line
from ..models import Adapter
from .audit import check_finite, check_loading, first_non_finite
from .hub import hub_kwargs


def choose_attention(model: torch.nn.Module, adapter: Adapter) -> None:
    """float64 models of families whose eager softmax runs in float32 get ``probe_eager``;
    a mixture-of-experts block runs its experts one by one (transformers' ``eager``
    experts), since the grouped matmul kernels take no float64."""
    if next(model.parameters()).dtype != torch.float64:
        return
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.config._experts_implementation = "eager"
    spec = getattr(adapter, "spec", None)
    if spec is not None and spec.float32_softmax:
        from ..models.attention import register

        model.config._attn_implementation = register()


def model_class(adapter: Adapter):
    """The transformers class a family loads as (``AutoModel``'s choice unless the spec names one)."""
    import transformers

    name = getattr(getattr(adapter, "spec", None), "model_class", "")
    return getattr(transformers, name) if name else transformers.AutoModel


def random_model(
    config, seed: int, device=None, dtype=None, adapter=None, what: str = "the random weights"
) -> torch.nn.Module:
    """The model at random init from ``seed``, its weights checked finite (``check_finite``,
    ``what`` naming them in the error)."""
    from transformers import AutoModel

    cls = AutoModel if adapter is None else model_class(adapter)

    device = torch.device("cpu") if device is None else torch.device(device)
    # On the CPU the weights are drawn in float32 and cast afterwards, so a seed gives the
    # same weights in every dtype.  Elsewhere the model is built directly on
    # the device in the target dtype, with no host copy of a model that may not fit it; the
    # device's own generator then draws the weights, which differ from the CPU's for a seed.
    on_cpu = device.type == "cpu"
    build_dtype = torch.float32 if on_cpu or dtype is None else dtype
    cuda = device.type == "cuda"
    forked = (
        [device.index if device.index is not None else torch.cuda.current_device()] if cuda else []
    )

    def build():
        if cls is AutoModel:
            return AutoModel.from_config(
                config, attn_implementation="eager", dtype=build_dtype, trust_remote_code=False
            )
        return cls._from_config(config, attn_implementation="eager", dtype=build_dtype)

    # Fresh weights from the seed, without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=forked), quiet(), device:
        torch.manual_seed(seed)
        # Each layer's own constructor draws torch's default init, which the model's
        # _init_weights then draws again: half the build time of a large model.  The first
        # draw is skipped (NaN instead); a tensor the model's init left alone keeps its NaN,
        # and then the model is built the plain way instead.
        with _torch_init_skipped():
            model = build()
        if _drawn_and_finite(model):
            return model
        torch.manual_seed(seed)
        model = build()
    check_finite(model, what)
    return model


def _drawn_and_finite(model: torch.nn.Module) -> bool:
    """No tensor kept the NaN of a skipped init, and every weight (``check_finite``'s
    tensors: the state dict) is finite: one pass that is also the finiteness check."""
    if first_non_finite(model) is not None:
        return False
    kept = {id(t) for t in model.state_dict(keep_vars=True).values()}
    return not any(_has_nan(t) for t in model.buffers() if id(t) not in kept)


def _has_nan(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and bool(tensor.isnan().any())


@contextlib.contextmanager
def _torch_init_skipped():
    """torch.nn.init's functions fill NaN instead of drawing, while a model is constructed.

    transformers' own initialisation keeps references to the real functions
    (``transformers.initialization.TORCH_INIT_FUNCTIONS``), so the model's _init_weights still
    draws every tensor it owns; only the layers' default init, which it overwrites, is skipped.
    """
    from transformers.initialization import TORCH_INIT_FUNCTIONS

    init = torch.nn.init
    saved = {name: getattr(init, name) for name in TORCH_INIT_FUNCTIONS if hasattr(init, name)}

    def nan(tensor, *args, **kwargs):
        with torch.no_grad():
            return tensor.fill_(math.nan) if tensor.is_floating_point() else tensor

    try:
        for name in saved:
            setattr(init, name, nan)
        yield
    finally:
        for name, function in saved.items():
            setattr(init, name, function)


def stored_dtype(model: torch.nn.Module) -> str:
    """The precision the model's floating weights hold after a load (the widest, where they
    mix): what a checkpoint stores where its files cannot be read (``probe.loading.stored``
    reads them)."""
    widths = {p.dtype: p.element_size() for p in model.parameters() if p.is_floating_point()}
    if not widths:
        return "none"
    return str(max(widths, key=widths.get)).removeprefix("torch.")


def pretrained_model(
    name: str,
    location,
    config,
    adapter: Adapter,
    allow_missing: bool,
    revision=None,
    seed=0,
    dtype: torch.dtype | str = "auto",
) -> tuple[torch.nn.Module, str]:
    """The base model with its checkpoint's weights (at hub ``revision``) read in ``dtype``
    (:mod:`probe.loading.stored`: the dtype that holds what the files store; "auto":
    transformers' choice, the config's), and a note on what did not load.  Tensors the
    checkpoint lacks (``allow_missing``) are drawn from ``seed``, as a random init's are,
    without disturbing the caller's generator."""
    where = f"folder {location}" if isinstance(location, Path) else f"hub id {name}"
    if revision is not None:
        where += f" at revision {revision}"
    try:
        with quiet(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, info = model_class(adapter).from_pretrained(
                location,
                config=config,
                trust_remote_code=False,
                attn_implementation="eager",
                # As stored: a float64 checkpoint keeps its float64 weights, and casting any
                # other to the run's dtype afterwards gives what reading it in float32 did.
                dtype=dtype,
                output_loading_info=True,
                # Mismatched shapes are reported below, in probe's words, not raised.
                ignore_mismatched_sizes=True,
                **hub_kwargs(location),
                **({} if revision is None else {"revision": revision}),
            )
    except Exception as err:  # any failure to read weights: OSError, SafetensorError, ...
        raise ProbeError(
            f"cannot load pretrained weights from {where} ({one_line(err)}); "
            "use `init` random, a complete save_pretrained folder, or the network"
        ) from None
    return model, check_loading(model, info, adapter, where, allow_missing)
