"""The one walker that executes any family's entry (:mod:`probe.models.family`).

:class:`SpecAdapter` walks any family's layers inside an nnsight trace and performs
the steps an analysis and an ablation ask for.  Every edit reaches the addition
itself, never subtracts afterwards, so an ablated layer equals module surgery to the
last bit (``tests/reference/layers.py`` is that surgery, written by hand).  The
operation names are the most fragile lines of the project: each family's entry
names the transformers source line it binds to, and :mod:`probe.surgery.self_test` verifies,
on every model before any numbers are produced, that the edits still mean what
they say (a transformers release that renames an operation fails there with one
line, never with wrong numbers).  The weights the path decomposition and the theory
panel need are read outside any trace by :mod:`probe.models.weights`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from probe.surgery.ablate import Ablation
from probe.surgery.masks import call_mask, remove_sinks

from ..errors import ProbeError
from .base import Adapter, LayerWeights, first
from .family import Family, Step, read, skip
from .forward_order import merged, resolve_envoy
from .weights import (
    affine_norm,
    layer_norm_sites,
    module_onloaded,
    norm_params,
    resolve_module,
    value_output,
)


class SpecAdapter(Adapter):
    """The walker: executes a :class:`Family` on any model of it."""

    def __init__(self, spec: Family) -> None:
        self.spec = spec
        self.family = spec.name
        self.model_types = spec.model_types
        self.unused_modules = spec.unused_modules
        self.forward_kwargs = dict(spec.forward_kwargs)
        self.inputs = spec.inputs
        self.causal = spec.causal
        self.norm_position = "post"  # per config: see norm_position_of
        self.table = (
            {"ablation": "no skip", "probe": spec.skip_means, "paper": _paper(spec)},
            {"ablation": "no MLP", "probe": spec.mlp_means, "paper": _paper(spec)},
        )
        self.paper_surgery = (
            "not probed in the paper: the paper's surgery (surgery='paper') is probe's definition"
        )
        if spec.name in ("bert",):
            self.paper_surgery = "the paper's surgery is probe's definition in this family"

    # --- configuration ------------------------------------------------------------
    def check(self, config) -> None:
        if self.spec.refuse is not None and (why := self.spec.refuse(config)):
            raise ProbeError(why)

    def style(self, config) -> str:
        return self.spec.style_of(config)

    def norm_position_of(self, config) -> str:
        return "post" if self.style(config) == "post" else "pre"

    @property
    def stream_note(self) -> str:  # type: ignore[override]
        return (
            "X_l is layer l's output as the next layer receives it (before any final norm); "
            "X_0 the first layer's input"
        )

    def describe(self, config) -> str:
        """The spec as text, one step a line, for ``probe models``, results and reports."""
        what = {"": "read", "no_skip": "no skip", "no_mlp": "no MLP"}
        lines = [f"layers: {self.spec.layers} ({self.style(config)} residual)"]
        lines += [
            f"{what[step.when] if step.act != 'read' else 'read'}: {step.describe()}"
            for step in self.spec.steps_of(config)
        ]
        lines.append(
            "LN-affine / no-LN: each norm inside the layer returns gamma x + beta / x "
            f"({self.spec.norm_kind})"
        )
        return "\n".join(lines)

    def norm_steps(self, model) -> tuple[Step, ...]:
        """The LN-affine and no-LN variants (``probe.surgery.ablate``) as steps on every norm module
        of a layer, in forward order.

        The norms are the layers' submodules of a norm class (LayerNorm, RMSNorm, T5's
        LayerNorm), except the query/key norms inside an attention (the entry's
        ``qk_norms``, Qwen3, OLMo2, StableLM's per-head norms), which are part of the
        attention's scores.  A site that is a norm in any layer is edited in every layer
        (skipping an Identity returns its input, as it does).  Their order is the order the
        layer's ``forward`` calls them (Falcon registers its second norm before the first);
        ``probe check`` holds both variants against the same norms replaced by torch hooks.
        """
        layers = resolve_module(model, self.spec.layers)
        sites = layer_norm_sites(layers, self.spec.qk_norms)
        affine = f"affine:{self.spec.norm_kind}"
        return tuple(skip(site, "input", when="norm_removed") for site in sites) + tuple(
            skip(site, affine, when="norm_affine") for site in sites
        )

    # --- inside a trace -----------------------------------------------------------
    def layers(self, root):
        return resolve_envoy(root, self.spec.layers)

    def install(self, root) -> None:
        """Build nnsight's ``.source`` of every module an operation step names, outside a trace.

        nnsight raises OutOfOrderError when a layer's ``.source`` is first touched after
        that layer's forward began; installing every one up front removes that trap.
        """
        config = root._module.config
        modules = {step.module for step in self.spec.steps_of(config) if step.op}
        # The attention's module too: its call of the attention function is where the run's
        # mask is read (:meth:`mask_step`) and no-sink edits it.
        modules.add(next(s.module for s in self.spec.steps_of(config) if s.name == "probs"))
        for layer in self.layers(root):
            for path in modules:
                _ = (resolve_envoy(layer, path) if path else layer).source

    def walk(
        self,
        root,
        ablation: Ablation,
        wanted: frozenset[str] = frozenset(),
        mlp_scale: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """``{"x": X_0}``, then per layer the reads in ``wanted`` and ``"x"``: X_l.

        All reads and edits happen in forward order (nnsight's requirement), as the
        family's steps list them.  ``mlp_scale``: only the MLP branch, at the entry's
        ``mlp_branch``, is multiplied by it (the self-test's check of that site; 0 allowed).
        """
        config = root._module.config
        steps = [s for s in self.spec.steps_of(config) if s.applies(ablation)]
        if mlp_scale is not None:
            site = self.spec.mlp_branch_of(config)
            at = next((i for i, s in enumerate(steps) if s.site == site), len(steps))
            steps = [*steps[:at], Step(site, "scale", when="scaled"), *steps[at:]]
            ablation = dataclasses.replace(ablation, branch_scale=1.0)
        if ablation.norm != "kept":
            norms = [s for s in self.norm_steps(root._module) if s.applies(ablation)]
            # With skip and MLP kept, nothing read and nothing scaled, the spec's own steps are
            # reads no norm run needs; else they run, the norms' steps merged in forward order.
            full = ablation.attn_skip and ablation.mlp and not wanted and mlp_scale is None
            steps = norms if full else merged(self.layers(root)[0], steps, norms, self.family)
        if ablation.remove == "sinks":
            steps = self.sink_steps(root, steps)
        if "mask" in wanted and (read_mask := self.mask_step(root)) is not None:
            at = next(i for i, s in enumerate(steps) if s.name == "probs")
            steps = [*steps[:at], read_mask, *steps[at:]]  # after a no-sink edit there
        if ablation.branch_scale != 1:
            steps = self.scale_steps(config, steps, ablation)
        needed = set(wanted) | {ref for s in steps for ref in s.refs()}
        layers = self.layers(root)
        yield {"x": first(layers[0].input)}
        sinks, massive = _by_layer(ablation.sinks), _by_layer(ablation.massive)
        alpha = ablation.branch_scale if mlp_scale is None else mlp_scale
        for index, layer in enumerate(layers, start=1):
            values = _run_steps(layer, steps, needed, sinks.get(index, ()), alpha)
            x = first(layer.output)
            if massive.get(index):  # no-massive: the clean run's corpus means, in place
                _replace_massive(x, massive[index])
            values["x"] = x
            yield values

    def sink_steps(self, root, steps: list[Step]) -> list[Step]:
        """``steps`` with the no-sink edit (:meth:`sink_step`) just before the probabilities'
        read, the first step that touches the attention."""
        at = next(i for i, s in enumerate(steps) if s.name == "probs")
        return [*steps[:at], self.sink_step(root), *steps[at:]]

    def interface_call(self, root) -> str:
        """The attention module's call of transformers' attention function
        (``attention_interface(self, q, k, v, mask, ...)``, eager or probe's) as a step's
        site, or "" where the family's attention computes its own softmax."""
        site = next(s.module for s in self.spec.steps_of(root._module.config) if s.name == "probs")
        names = resolve_envoy(self.layers(root)[0], site).source.names
        ops = [name for name in names if name.startswith("attention_interface_")]
        return f"{site}:{ops[-1]}" if ops else ""

    def mask_step(self, root) -> Step | None:
        """The read of the mask the attention function received (``mask``): the run's own,
        per layer (:func:`probe.surgery.masks.seen`); None where there is no such call."""
        site = self.interface_call(root)
        return read("mask", site, part="mask") if site else None

    def sink_step(self, root) -> Step:
        """The no-sink edit: the mask that transformers' attention function
        (``attention_interface(self, q, k, v, mask)``, eager or ``probe_eager``) adds to the
        scores gets the dtype's minimum at each sink key of the layer's heads
        (:func:`probe.surgery.masks.remove_sinks`), as a padding key has it.  A family whose attention computes
        its own softmax (BLOOM, Falcon, DeBERTa-v2) refuses in one line."""
        site = self.interface_call(root)
        if not site:
            raise ProbeError(
                f"no-sink needs an attention that calls transformers' attention functions; the "
                f"{self.family} attention computes its own softmax: leave no-sink out"
            )
        return Step(site, "set", part="mask", value="no-sink", when="sinks")

    def scale_steps(self, config, steps: list[Step], ablation: Ablation) -> list[Step]:
        """``steps`` with residual branch scaling (:mod:`probe.surgery.scaling`): the attention branch
        is multiplied by alpha where the entry reads it (the value the layer adds to its
        residual), right after that read; the MLP branch, where the MLP has not been
        removed, at the entry's ``mlp_branch``: before the first step at that site (GPT-NeoX's
        no-skip reads it there) or after the last step.  An edit later in the layer that
        uses the branch (a no-skip sum) takes the scaled value."""
        at = next(i for i, s in enumerate(steps) if s.act == "read" and s.name == "branch")
        read = steps[at]
        attn = Step(read.site, "scale", part=read.part, index=read.index, value="branch",
                    when="scaled")  # fmt: skip
        steps = [*steps[: at + 1], attn, *steps[at + 1 :]]
        if not ablation.mlp:
            return steps
        site = self.spec.mlp_branch_of(config)
        mlp = Step(site, "scale", when="scaled")
        at = next((i for i, s in enumerate(steps) if s.site == site), len(steps))
        return [*steps[:at], mlp, *steps[at:]]

    def stream(self, root, tracer, ablation: Ablation) -> Iterator[torch.Tensor]:
        for values in self.walk(root, ablation):
            yield values["x"]

    def paths_stream(
        self, root, tracer, ablation: Ablation, norms: bool = True, masks: bool = False
    ):
        wanted = {"probs"} | ({"norm", "branch_norm"} if norms else set())
        wanted |= {"mask"} if masks else set()
        previous = None
        for i, values in enumerate(self.walk(root, ablation, frozenset(wanted))):
            x, previous = previous, values["x"]
            if i == 0:
                yield values
                continue
            # A layer without a norm before its attention (OLMo2): the heads read the layer's
            # input itself, whose frozen "norm" is the identity (kind none, see layer_weights).
            yield {
                "x": values["x"],
                "attn": values["probs"],
                "norm_input": values.get("norm", x) if norms else None,
                "branch_norm_input": values.get("branch_norm") if norms else None,
            } | ({"mask": values["mask"]} if "mask" in values else {})

    # --- weights (outside any trace) ----------------------------------------------
    def layer_weights(self, model, index: int) -> LayerWeights:
        spec, config = self.spec, model.config
        if spec.heads_of(config) is None:
            raise ProbeError(f"the {spec.name} family has no path decomposition in probe")
        layer = resolve_module(model, spec.layers)[index]
        heads = self.n_heads(config)
        kv_heads = spec.kv_heads_of(config, heads)
        w_v, b_v, w_o, b_o = value_output(layer, spec.heads_of(config), config, heads, kv_heads)
        m = spec.branch_multiplier(config)
        if m != 1:  # Granite adds m times the attention's output: every head and its bias
            w_o, b_o = w_o * m, b_o * m
        site = self.read_site(config, "norm") or spec.norm_of(config)
        norm = resolve_module(layer, site) if site else torch.nn.Identity()  # no norm: kind none
        gamma, beta, eps, kind = norm_params(norm, spec.norm_kind)
        extra = {}
        if branch := self.read_site(config, "branch_norm") or spec.branch_norm:
            g, _, e, k = norm_params(resolve_module(layer, branch), spec.norm_kind)
            extra = {"branch_gamma": g, "branch_eps": e, "branch_kind": k}
        return LayerWeights(
            w_v=w_v,
            b_v=b_v,
            w_o=w_o,
            b_o=b_o,
            gamma=gamma,
            beta=beta,
            eps=eps,
            norm=self.norm_position_of(config),
            kind=kind,
            **extra,
        )

    def read_site(self, config, name: str) -> str:
        """The module whose value the step reading ``name`` takes, on this config ("" if none).

        The norm the decomposition freezes is the one whose input the walk reads, so its
        weights and its 1/sigma always come from the same module (Falcon's ``ln_attn`` or
        ``input_layernorm``, as the config says).
        """
        for step in self.spec.steps_of(config):
            if step.act == "read" and step.name == name:
                return step.module
        return ""

    def final_norm(self, model):
        if not self.spec.final_norm:
            return None
        module = resolve_module(model, self.spec.final_norm, missing_ok=True)
        if module is None:
            return None
        gamma, beta, eps, kind = norm_params(module, self.spec.norm_kind)
        return gamma, beta, eps, kind

    def final_output(self, model, x: torch.Tensor) -> torch.Tensor:
        """The model's output from the last layer's output x: the modules after the last
        layer (final norm, OPT-350m's project_out), as the model runs them."""
        with torch.no_grad():
            for path in self.spec.output_modules():
                module = resolve_module(model, path, missing_ok=True)
                if module is not None:
                    x = module(x)
        return x

    def output_projection(self, model) -> torch.Tensor | None:
        """(out, hidden) weight of a bias-free linear map after the final norm, if the model's
        output has one (OPT-350m's ``project_out``): the decomposition maps every path through it.
        """
        after = [
            resolve_module(model, m, missing_ok=True)
            for m in self.spec.output_modules()
            if m != self.spec.final_norm
        ]
        after = [m for m in after if m is not None]
        if not after:
            return None
        if len(after) > 1 or not isinstance(after[0], torch.nn.Linear) or after[0].bias is not None:
            raise ProbeError(
                f"the {self.family} output ends in {type(after[-1]).__name__}, not one linear map; "
                "the path decomposition cannot carry it"
            )
        return after[0].weight.detach()

    def lm_head(self, model) -> torch.Tensor | None:
        """The tied input embeddings, where they are the LM head of the model's output."""
        if not self.spec.lm_head or not getattr(model.config, "tie_word_embeddings", False):
            return None
        module = resolve_module(model, self.spec.lm_head, missing_ok=True)
        return None if module is None else module.weight.detach()

    def attention_probs(self, layer):  # the analyses read them through paths_stream
        raise NotImplementedError("spec families read attention through walk()")

    def norm_input(self, layer):
        raise NotImplementedError("spec families read norms through walk()")


def _paper(spec: Family) -> str:
    if spec.name == "bert":
        return "the same"
    return "not probed in the paper; probe's definition"


# --- running steps ----------------------------------------------------------------


def _by_layer(entries) -> dict[int, list[tuple]]:
    """(layer, ...) tuples -> {layer: [(...), ...]}, in their order."""
    out: dict[int, list[tuple]] = {}
    for layer, *rest in entries:
        out.setdefault(layer, []).append(tuple(rest))
    return out


def _replace_massive(x, entries) -> None:
    """no-massive: x[:, t, d] <- the clean run's corpus mean there, in every sequence."""
    entries = [(t, d, v) for t, d, v in entries if t < x.shape[1]]
    if not entries:
        return
    tokens = torch.tensor([t for t, _, _ in entries], device=x.device)
    dims = torch.tensor([d for _, d, _ in entries], device=x.device)
    values = torch.tensor([v for _, _, v in entries], dtype=torch.float64).to(x.device, x.dtype)
    x[:, tokens, dims] = values


def _run_steps(
    layer, steps: list[Step], needed: set[str], sinks=(), alpha: float = 1.0
) -> dict[str, Any]:
    """Perform one layer's steps in order; the named reads that ``needed`` asks for
    (``sinks``: the layer's (head, key) pairs for the no-sink edit; ``alpha``: the branch
    scale of the ``scale`` steps)."""
    reads: dict[str, Any] = {}
    fetched: dict[tuple[str, str], Any] = {}  # one request per location: nnsight serves it once

    def fetch(step: Step):
        key = (step.site, step.part)
        if key not in fetched:
            fetched[key] = _get(_site(layer, step), step.part)
        return fetched[key]

    for step in steps:
        if step.act == "read":
            if step.name in needed:
                value = fetch(step)
                reads[step.name] = value if step.index is None else value[step.index]
            continue
        target = _site(layer, step)
        if step.act == "scale":
            scaled = _scaled(fetch(step), step.index, alpha)
            _put(target, step.part, scaled)
            fetched[(step.site, step.part)] = scaled  # a later read there sees alpha f(x)
            if step.value in reads:
                reads[step.value] = scaled if step.index is None else scaled[step.index]
            continue
        if step.value == "no-sink":  # a read of the mask there takes it as the model gave it
            fetched[(step.site, "mask")] = remove_sinks(target, sinks)
        elif step.act == "skip":
            target.skip(_value(step, target, reads))
        elif step.act == "zero":
            _put(target, step.part, torch.zeros_like(first(_get(target, step.part))))
        else:
            _put(target, step.part, _value(step, target, reads))
    return reads


def _scaled(value, index: int | None, alpha: float):
    """``value * alpha``, or a tuple with its element ``index`` so multiplied."""
    if index is None:
        return value * alpha
    return (*value[:index], value[index] * alpha, *value[index + 1 :])


def _value(step: Step, target, reads: dict[str, Any]):
    if step.is_affine:
        # The norm's output is replaced after its forward, when accelerate has sent an
        # offloaded norm's weights back: they are read in again for the product.
        with module_onloaded(target._module):
            return affine_norm(target._module, step.value.split(":", 1)[1], first(target.input))
    if step.value == "zeros":
        return torch.zeros_like(first(target.input))
    if step.value == "input":
        return target.input
    names = step.value.split("+")
    value = reads[names[0]]
    for name in names[1:]:
        value = value + reads[name]
    return value


def _site(layer, step: Step):
    module = resolve_envoy(layer, step.module) if step.module else layer
    return getattr(module.source, step.op) if step.op else module


def _get(target, part: str):
    if part == "output":
        return target.output
    if part == "input":
        return target.input
    if part.startswith("arg"):
        args, _ = target.inputs
        return args[int(part[3:])]
    if part == "mask":  # an attention function's mask
        return call_mask(*target.inputs)
    raise AssertionError(part)


def _put(target, part: str, value) -> None:
    if part == "output":
        target.output = value
    elif part == "input":
        target.input = value
    elif part.startswith("arg"):
        args, kwargs = target.inputs
        args = list(args)
        args[int(part[3:])] = value
        target.inputs = (tuple(args), kwargs)
    else:
        raise AssertionError(part)
