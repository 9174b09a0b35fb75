"""Does a family's spec still mean what it says on this model?  The self-test.

A spec names operations of transformers' code (``residual_0``: the line
``residual = hidden_states``).  A transformers release can rename or move them; an
edit that then lands on the wrong value would give numbers from a wrong ablation.
So before any numbers, probe checks on the model itself, layer by layer, the
identities that hold only if the edits are right (x the layer's input, b the
attention branch the spec reads, N the sublayer's norm of a post-LN family):

* **clean**: the walked residual stream X_0 .. X_L equals HuggingFace's own
  ``hidden_states`` (and, where a final norm follows the last layer, the model's
  output equals that norm of X_L), and a clean run after ablated ones gives the
  same numbers (the model was left as it was);
* **SAN**: each layer's output equals its attention branch alone, N(b) post-LN;
* **SAN+skip**: each layer's output equals x + b, N(x + b) post-LN;
* **probe's attention = the model's own**: the attention probe computes itself (float64
  runs, masks) equals the function the model's own code defines, call by call
  (:mod:`probe.surgery.core_check`): not probe against probe.

Beyond them, what an entry enables (:func:`capabilities`): the MLP branch that branch
scaling multiplies, the LayerNorm variants against the same norms replaced by torch hooks,
and the variants composed of both: SAN and SAN+skip with their norms made affine or
removed hold the identities above with A (the norm's affine part) or nothing for N, and,
pre-LN, agree at the first layer with the model whose norms and MLP branch torch hooks
replace.

:func:`identities` measures them (``probe check MODEL`` prints them; the test suite
asserts exact equality in float64 for every family); :func:`verify` runs them on a
short input when a model is loaded and refuses the model with one line naming the
identity that failed.  They hold exactly in any precision on a deterministic device
(the same operations run on both sides); :func:`verify` allows a few units in the
last place of the dtype, so a nondeterministic GPU kernel does not refuse a right spec,
while a wrong edit is off by the size of the values themselves.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from probe.errors import ProbeError
from probe.measures.overflow import overflow_advice
from probe.models.base import first
from probe.models.spec import SpecAdapter
from probe.models.weights import affine_norm, module_onloaded, resolve_module
from probe.surgery import core_check
from probe.surgery.ablate import SAN, SAN_SKIP, TRANSFORMER
from probe.surgery.identity import ULPS, Identity

#: The sources a passed self-test depends on besides the model's own (``verified_key``).
CODE = (
    "surgery/self_test.py",
    "models/family.py",
    "models/spec.py",
    "models/forward_order.py",
    "models/weights.py",
    "models/builders.py",
    "models/families.py",
    "models/by_config.py",
    "models/conformance.py",
    "models/attention.py",
    "surgery/core_check.py",
    "surgery/identity.py",
)


def identities(probed, data: torch.Tensor | None = None, mask: torch.Tensor | None = None):
    """The identities above on one batch (default: one seeded sequence of 8 tokens)."""
    adapter = probed.adapter
    if isinstance(adapter, SpecAdapter):
        entry = _entry(probed)
        if entry.error:  # nothing else means anything on modules the entry does not describe
            return [entry]
    data, mask = _inputs(probed, data, mask)
    clean, clean_walk = _clean(probed, data, mask)
    found = [clean]
    if isinstance(adapter, SpecAdapter):
        san, _ = _ablated(probed, data, mask, SAN)
        san_skip, skip_walk = _ablated(probed, data, mask, SAN_SKIP)
        found = [entry, clean, san, san_skip]
        found += capabilities(probed, data, mask, clean_walk, skip_walk)
    found.append(core_check.identity(probed, data, mask))
    found.append(_unchanged(probed, data, mask, clean))
    return found


def verify(probed) -> None:
    """Refuse (one line) a model on which a spec identity fails; see the module docstring.

    A pass is remembered (``verified_key``): the identities depend on the code that runs,
    not on the weights, so the same architecture, spec, dtype, attention and library
    versions need not be checked again (``PROBE_CACHE_DIR``, default ``~/.cache/probe``;
    an unwritable folder only means the check runs every time)."""
    kept = marker(probed)
    if kept is not None and kept.exists():
        return
    eps = torch.finfo(probed.dtype).eps if probed.dtype.is_floating_point else 0.0
    for identity in identities(probed):
        if identity.name in (ENTRY, core_check.CORE) and identity.error:
            raise ProbeError(identity.error)
        if not identity.holds(ULPS * eps):
            if not identity.error and not math.isfinite(identity.max_diff + identity.scale):
                if identity.field == "norm_kind":  # no normalisation, so this dtype overflows:
                    continue  # a run of that variant meets the overflow and says so itself
                raise ProbeError(  # not the spec: the model's own forward overflowed
                    f"{probed.name}: the self-test's forward pass ({identity.name}) holds NaN "
                    f"or inf: it overflowed in {str(probed.dtype).removeprefix('torch.')}; "
                    f"{overflow_advice(probed.dtype)}"
                )
            what = identity.error or (
                f"off by {identity.max_diff:.3g} (values of size {identity.scale:.3g})"
            )
            raise ProbeError(
                f"the {probed.family} spec does not fit this model: {identity.name} fails "
                f"{identity.detail}({what}); the entry's {identity.field} does not describe "
                "this layer's forward, or transformers renamed an operation it names; "
                f"`probe check {probed.name}` shows every identity"
            )
    remember(kept)


def verified_key(probed) -> str:
    """What a passed self-test depends on: the model's classes and config, the spec, the
    dtype, attention and device kind, and the versions of the code that runs."""
    import hashlib
    import inspect
    import json
    import re
    from importlib import metadata
    from pathlib import Path

    sources = Path(__file__).parents[1]  # probe/
    code = hashlib.sha256()
    for name in CODE:
        code.update((sources / name).read_bytes())
    # The model's own modelling code (an edited or patched install keeps its version number).
    code.update(Path(inspect.getfile(type(probed.model))).read_bytes())
    versions = {}
    for package in ("torch", "transformers", "nnsight", "probe"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "?"
    parts = {
        "model": f"{type(probed.model).__module__}.{type(probed.model).__qualname__}",
        "config": probed.config.to_json_string(use_diff=False),
        # A function's repr holds its address, which differs in every process: its name stays.
        "spec": re.sub(
            r" at 0x[0-9a-f]+>", ">", repr(getattr(probed.adapter, "spec", probed.adapter.family))
        ),
        "dtype": str(probed.dtype),
        # The attention asked for (what ran is known only after a run: see attention.ran).
        "attention": str(getattr(probed.config, "_attn_implementation", "eager")),
        "device": probed.device.type,
        "versions": versions,
        "code": code.hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def marker(probed, check: str = "", sources: tuple[str, ...] = ()):
    """The file whose presence says this key passed, or None where none can be kept; another
    ``check`` remembered so adds the bytes of the sources it runs to the self-test's key."""
    import hashlib
    from pathlib import Path

    from probe.files.cache import root

    try:
        key = verified_key(probed)
        if check:
            digest = hashlib.sha256(key.encode())
            for source in sources:
                digest.update(Path(source).read_bytes())
            key = f"{check}-{digest.hexdigest()}"
        return root() / "verified" / key
    except (OSError, RuntimeError, TypeError):  # no home, no source file: check every time
        return None


def remember(marker) -> None:
    """Keep the file that says a check passed (nothing where it cannot be written)."""
    if marker is None:
        return
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:  # a read-only home: the check simply runs again next time
        pass


def short_input(probed) -> tuple[torch.Tensor, torch.Tensor]:
    """The self-test's own input: one seeded sequence of 8 tokens (or one noise image) and
    its mask, on the model's device."""
    return _inputs(probed, None, None)


def _inputs(probed, data, mask):
    if data is not None:
        return data.to(probed.device), (torch.ones_like(data) if mask is None else mask).to(
            probed.device
        )
    generator = torch.Generator().manual_seed(0)
    if probed.adapter.inputs == "pixels":
        config = probed.config
        size = config.image_size
        data = torch.randn(1, config.num_channels, size, size, generator=generator)
        data = data.to(device=probed.device, dtype=probed.dtype)
        tokens = (size // config.patch_size) ** 2 + 1
        return data, torch.ones(1, tokens, dtype=torch.long, device=probed.device)
    limit = probed.adapter.max_tokens(probed.config) or 8
    ids = torch.randint(0, probed.config.vocab_size, (1, min(8, limit)), generator=generator)
    return ids.to(probed.device), torch.ones_like(ids).to(probed.device)


def _walk(probed, data, mask, ablation, wanted=frozenset(), mlp_scale=None) -> list[dict]:
    root = probed.envoy
    out: list[dict] = []  # outside the trace: nnsight keeps what the body appends
    with torch.no_grad(), root.trace(**probed.adapter.model_inputs(data, mask)) as tracer:
        if isinstance(probed.adapter, SpecAdapter):
            for values in probed.adapter.walk(root, ablation, frozenset(wanted), mlp_scale):
                out.append(values)
        else:
            for x in probed.adapter.stream(root, tracer, ablation):
                out.append({"x": x})
    return out


def _diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if a.shape != b.shape:
        return float("inf"), float(b.abs().max())
    return float((a - b).abs().max()), float(b.abs().max())


#: The first row: the entry checked against the model's modules (:mod:`probe.models.conformance`).
ENTRY = "entry = the model's modules"


def _entry(probed) -> Identity:
    from probe.models.conformance import check_entry

    try:
        check_entry(probed.adapter.spec, probed.model)
    except ProbeError as err:
        return Identity(ENTRY, float("inf"), 0.0, error=str(err), field="")
    return Identity(ENTRY, 0.0, 0.0, field="")


def capabilities(probed, data, mask, clean_walk, skip_walk) -> list[Identity]:
    """The identities of what an entry enables beyond the four ablations, each measured
    without the entry's own sites: the MLP branch that residual branch scaling multiplies,
    the LayerNorm variants against the norms replaced by plain torch hooks, and SAN and
    SAN+skip with those norms (:func:`_composed`).  ``clean_walk``,
    ``skip_walk``: X_0 .. X_L of the clean and SAN+skip runs the identities made (None where
    one failed)."""
    found = []
    if probed.adapter.style(probed.config) != "post":
        found.append(_mlp_branch(probed, data, mask, clean_walk, skip_walk))
    for norm in ("affine", "removed"):
        found.append(_norm_variant(probed, data, mask, norm))
        found += _composed(probed, data, mask, norm)
    return found


def _clean(probed, data, mask) -> tuple[Identity, list | None]:
    """The clean run's identity, and its X_0 .. X_L (None where the walk failed)."""
    name = "clean run = HF hidden_states"
    try:
        with torch.no_grad():
            out = probed.model(**probed.adapter.model_inputs(data, mask), output_hidden_states=True)
    except Exception as err:  # not the spec: the model itself does not run like this
        raise ProbeError(
            f"{probed.name} does not run in {str(probed.dtype).removeprefix('torch.')} on "
            f"{probed.device.type} under transformers ({one_line(err)}); try another `dtype`"
        ) from None
    try:
        walked = [v["x"] for v in _walk(probed, data, mask, TRANSFORMER)]
    except Exception as err:  # a renamed site fails inside nnsight
        return Identity(name, float("inf"), 0.0, error=one_line(err)), None
    hf = list(out.hidden_states)
    worst, scale, where = 0.0, 0.0, ""
    batch_first = getattr(probed.adapter, "batch_first", lambda x: x)
    last = len(walked) - 1
    for layer, x in enumerate(walked):
        reference = hf[layer] if layer < len(hf) else None
        final = _final(probed, x) if layer == last else None
        if layer == last and final is not None:  # HF's last entry may come after the final norm
            reference, x = out.last_hidden_state, final
        if reference is None:
            continue
        d, s = _diff(x, reference if reference.shape == x.shape else batch_first(reference))
        scale = max(scale, s)
        if d > worst:
            worst, where = d, f"at layer {layer} "
    return Identity(name, worst, scale, where), walked


def _final(probed, x):
    """The model's output from X_L through the modules after the last layer, if any run."""
    spec = getattr(probed.adapter, "spec", None)
    modules = [
        resolve_module(probed.model, path, missing_ok=True)
        for path in (spec.output_modules() if spec is not None else ())
    ]
    modules = [m for m in modules if m is not None]
    if not modules:
        return None
    with torch.no_grad():
        for module in modules:
            x = module(x)
    return x


def _ablated(probed, data, mask, ablation) -> tuple[Identity, list | None]:
    """The identity of ``ablation`` (SAN or SAN+skip, its norms kept, made affine or
    removed), and its X_0 .. X_L (None where the walk failed)."""
    adapter: SpecAdapter = probed.adapter
    post = adapter.style(probed.config) == "post"
    inner = "x + branch" if ablation.attn_skip else "branch"
    mode = ablation.norm  # post-LN: the sublayer norm N kept, its affine part A, or none
    outer = {"kept": "N", "affine": "A"}.get(mode) if post else None
    name = f"{ablation.name} = " + (f"{outer}({inner})" if outer else inner)
    field = "steps" if mode == "kept" else "norm_kind"
    try:
        walked = _walk(probed, data, mask, ablation, {"branch"})
    except Exception as err:
        return Identity(name, float("inf"), 0.0, error=one_line(err), field=field), None
    norm = adapter.spec.norm_of(probed.config)
    layers = resolve_module(probed.model, adapter.spec.layers)
    m = adapter.spec.branch_multiplier(probed.config)  # Granite's residual_multiplier
    worst, scale, where = 0.0, 0.0, ""
    for layer in range(1, len(walked)):
        x, values = walked[layer - 1]["x"], walked[layer]
        branch = values["branch"] if m == 1 else values["branch"] * m
        expected = x + branch if ablation.attn_skip else branch
        if outer:
            module = resolve_module(layers[layer - 1], norm)
            with torch.no_grad():
                expected = (
                    module(expected) if mode == "kept" else _affine(module, adapter, expected)
                )
        d, s = _diff(values["x"], expected)
        scale = max(scale, s)
        if d > worst:
            worst, where = d, f"at layer {layer} "
    return Identity(name, worst, scale, where, field=field), walked


def _affine(module, adapter, x):
    """The affine part of a norm applied to x, its weights read in where offloaded."""
    with module_onloaded(module):
        return affine_norm(module, adapter.spec.norm_kind, x)


def _composed(probed, data, mask, norm: str) -> list[Identity]:
    """SAN and SAN+skip with their norms made affine or removed (``norm``), as the walker
    merges the norms' steps among theirs: each layer as :func:`_ablated` states it; and,
    pre-LN, where the branch itself reads a norm, the first layer (whose input X_0 no edit
    changes) against the model with the same norms and its MLP branch zeroed by torch hooks
    (:func:`_hooked`, no nnsight edit; where the entry's ``mlp_branch`` is a module, not an
    op of the forward), SAN's branch there against SAN+skip's."""
    found, walks = [], {}
    for base in (SAN, SAN_SKIP):
        identity, walks[base] = _ablated(probed, data, mask, dataclasses.replace(base, norm=norm))
        found.append(identity)
    site = probed.adapter.spec.mlp_branch_of(probed.config)
    if probed.adapter.style(probed.config) == "post" or site.startswith(":"):
        return found  # post-LN: no norm in the branch; an op's output takes no torch hook
    variant = dataclasses.replace(SAN_SKIP, norm=norm).name
    full = dataclasses.replace(TRANSFORMER, norm=norm).name
    name = f"{variant} at layer 1 = {full} by torch hooks, its MLP branch zeroed"
    if walks[SAN] is None or walks[SAN_SKIP] is None:
        return [*found, Identity(name, float("inf"), 0.0, error="a run above failed")]
    try:
        hooked = _hooked(probed, data, mask, norm, mlp=False)[1]
    except Exception as err:
        return [*found, Identity(name, float("inf"), 0.0, error=one_line(err), field="norm_kind")]
    skip, san = walks[SAN_SKIP][1], walks[SAN][1]
    d, s = _diff(skip["x"], hooked)
    d_branch, s_branch = _diff(san["branch"], skip["branch"])  # one input, one branch
    return [*found, Identity(name, max(d, d_branch), max(s, s_branch), field="norm_kind")]


def _mlp_branch(probed, data, mask, clean_walk, skip_walk) -> Identity:
    """At the first layer (whose input X_0 no edit changes), the MLP branch scaled by alpha at
    the entry's ``mlp_branch`` gives y(0) = the SAN+skip output h (the site carries the whole
    branch) and y(2) - y(0) = 2 (y(1) - y(0)) (it enters the residual sum linearly): a site
    before the activation, or on the MLP's input, breaks one of them.  y(1) and h are the
    clean and SAN+skip runs' first layers (``clean_walk``, ``skip_walk``)."""
    site = probed.adapter.spec.mlp_branch_of(probed.config)
    name = f"MLP branch x alpha at {site} = alpha (y - y without MLP)"
    if clean_walk is None or skip_walk is None:
        return Identity(name, float("inf"), 0.0, error="the clean or SAN+skip run failed")
    y1, h = clean_walk[1], skip_walk[1]["x"]
    try:
        y0 = _walk(probed, data, mask, TRANSFORMER, mlp_scale=0.0)[1]["x"]
        y2 = _walk(probed, data, mask, TRANSFORMER, mlp_scale=2.0)[1]["x"]
    except Exception as err:
        return Identity(name, float("inf"), 0.0, error=one_line(err), field="mlp_branch")
    d0, s0 = _diff(y0, h)
    d2, s2 = _diff(y2.double() - y0.double(), 2 * (y1.double() - y0.double()))
    scale = max(s0, s2, float(y2.abs().max()))
    return Identity(name, max(d0, d2), scale, "at layer 1 ", "", "mlp_branch")


def _norm_variant(probed, data, mask, norm: str) -> Identity:
    """LN-affine (``affine``) or no-LN (``removed``) by the walker = the same norms replaced
    by plain torch forward hooks on the model (:func:`_hooked`)."""
    ablation = dataclasses.replace(TRANSFORMER, norm=norm)
    name = f"{ablation.name} = its norms replaced by torch hooks"
    try:
        walked = [v["x"] for v in _walk(probed, data, mask, ablation)]
        states = _hooked(probed, data, mask, norm)
    except Exception as err:
        return Identity(name, float("inf"), 0.0, error=one_line(err), field="norm_kind")
    worst, scale = 0.0, 0.0
    for a, b in zip(walked, states, strict=False):
        d, s = _diff(a, b)
        worst, scale = max(worst, d), max(scale, s)
    if len(walked) != len(states):
        return Identity(
            name, float("inf"), scale, error="the runs differ in length", field="norm_kind"
        )
    return Identity(name, worst, scale, field="norm_kind")


def _hooked(probed, data, mask, norm: str, mlp: bool = True) -> list[torch.Tensor]:
    """X_0 .. X_L of the model with its norms replaced by plain torch forward hooks (their
    affine part, or removed) and, without ``mlp``, the MLP branch at the entry's
    ``mlp_branch`` zeroed; the hooks are removed again after."""
    from probe.models.weights import layer_norm_sites

    adapter: SpecAdapter = probed.adapter
    kind = adapter.spec.norm_kind
    layers = resolve_module(probed.model, adapter.spec.layers)

    def replace(module, args, kwargs, output):
        x = args[0] if args else next(iter(kwargs.values()))
        if norm == "removed":
            return x
        # A forward hook runs after accelerate's hook sent an offloaded norm's weights back.
        with module_onloaded(module):
            return affine_norm(module, kind, x)

    def zero(module, args, output):
        if isinstance(output, tuple):
            return (torch.zeros_like(output[0]), *output[1:])
        return torch.zeros_like(output)

    handles, states = [], []
    try:
        sites = layer_norm_sites(layers, adapter.spec.qk_norms)
        for layer in layers:
            for site in sites:
                module = resolve_module(layer, site)
                handles.append(module.register_forward_hook(replace, with_kwargs=True))
            if not mlp:
                branch = resolve_module(layer, adapter.spec.mlp_branch_of(probed.config))
                handles.append(branch.register_forward_hook(zero))
        handles.append(
            layers[0].register_forward_pre_hook(
                lambda m, a, k: states.append(a[0] if a else k["hidden_states"]),
                with_kwargs=True,
            )
        )
        handles += [
            layer.register_forward_hook(lambda m, a, out: states.append(first(out)))
            for layer in layers
        ]
        with torch.no_grad():
            probed.model(**adapter.model_inputs(data, mask))
    finally:
        for handle in handles:
            handle.remove()
    return states


def _unchanged(probed, data, mask, clean: Identity) -> Identity:
    name = "clean run after ablated runs = first clean run"
    if clean.error:
        return Identity(name, float("inf"), 0.0, error="the clean run failed")
    try:
        before = [v["x"] for v in _walk(probed, data, mask, TRANSFORMER)]
        _walk(probed, data, mask, SAN)
        again = [v["x"] for v in _walk(probed, data, mask, TRANSFORMER)]
    except Exception as err:
        return Identity(name, float("inf"), 0.0, error=one_line(err))
    worst, scale = 0.0, 0.0
    for a, b in zip(again, before, strict=True):
        d, s = _diff(first(a), first(b))
        worst, scale = max(worst, d), max(scale, s)
    return Identity(name, worst, scale)


def one_line(err: BaseException) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text[:300]
