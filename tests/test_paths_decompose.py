"""probe paths --decompose on every family in the registry: the programme against brute-force
enumeration of all paths, the frozen network against the real SAN+skip run, the Dataset,
the task measures, the report and the CLI.

The families come from ``probe.models.ADAPTERS`` (plus the config branches of
``TINY_VARIANTS`` and the path tests' own ``PATH_VARIANTS``), so a new family is
covered as soon as it has its entry and its tiny config.  The oracle
(``tests/reference/path_enumeration.py``) reads the weights from each family's own
modules, makes its own SAN+skip run by module surgery, and sums all (H+1)^L paths.

Tolerances, in units of float64's machine epsilon EPS = 2^-52 times the size of the
values compared (O(1) here):

* ``ROUNDING`` = 16 EPS: float64 rounding through at most 3 layers of length-32 dot
  products and sums of at most 125 paths.  Measured: at most 6 EPS over three seeds
  of every family.  Every mistake the tests guard against (a missing bias, a norm
  in the wrong place, a value head of the wrong group, a norm not frozen) moves the
  values by 1e-2 or more.
* ``F32_NORM``: HF's RMSNorm (Llama, Mistral, Qwen2/3, Phi3, Gemma/Gemma2, T5) casts
  its input to float32 even in a float64 model, so the real run carries float32
  rounding that the frozen (linear) network cannot reproduce.  Each such norm is off
  by a few float32 units in the last place (2^-24 each); the bound allows 8 of them
  per norm applied before the compared layer.  Measured: at most 1.8 per norm over
  five seeds.  The
  same models with float64 RMS norms (a test below swaps them in) are back within
  ``ROUNDING``, which shows the float32 norms are the whole gap.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import probe
from probe.analyses import paths
from probe.analyses.path_decompose import frozen_run, lm_loss, logit_map, output_terms
from probe.cli.app import app
from probe.errors import ProbeError
from probe.measures import frozen
from probe.models import ADAPTERS, SpecAdapter
from probe.reports.index import read_meta
from probe.reports.paths_report import render_paths
from tests.paths_tiny import (
    PATH_VARIANTS,
    model_inputs,
    one_thread,  # noqa: F401  (autouse: one torch thread here)
    path_model,
)
from tests.reference.attention import register as reference_attention
from tests.reference.path_enumeration import (
    FrozenReference,
    final_norm,
    layer_params,
    reference_reads,
)
from tests.reference.path_families import NoReference
from tests.reference.surgery import reference_hidden_states as surgery_reference
from tests.reference.tiny import TINY_CONFIGS, TINY_VARIANTS

EPS = 2.0**-52
ROUNDING = 16 * EPS
U32 = 2.0**-24  # float32's unit roundoff
F32_PER_NORM = 8 * U32

REGISTRY = sorted(ADAPTERS)
#: Every tiny model: one per family in the registry, plus the config branches.
NAMES = REGISTRY + sorted(TINY_VARIANTS) + sorted(PATH_VARIANTS)


def _family(name: str) -> str:
    return {**TINY_VARIANTS, **PATH_VARIANTS}.get(name, (name,))[0]


DECOMPOSABLE = [n for n in NAMES if not ADAPTERS[_family(n)].not_decomposable]
REFUSED = [n for n in NAMES if ADAPTERS[_family(n)].not_decomposable]
WALKED = [n for n in DECOMPOSABLE if isinstance(ADAPTERS[_family(n)], SpecAdapter)]


def _float32_norms(model) -> bool:
    """The family's attention norm (or, with none before the heads, the norm on their output:
    OLMo2) computes in float32: an RMS norm, or Cohere's LayerNorm."""
    return _rms_norms(model) or layer_params(model, 0).norm.float32


def _rms_norms(model) -> bool:
    """The family's attention norm (or the norm on the heads' output) is an RMS norm."""
    layer = layer_params(model, 0)
    return layer.norm.kind == "rms" or (layer.norm.kind == "none" and _rms_branch(layer))


def _rms_branch(layer) -> bool:
    return layer.branch is not None and layer.branch.kind == "rms"


def _collected_float32_norms(name: str) -> bool:
    """At collection: a family without a reference entry is kept, to fail in its own test."""
    try:
        return _float32_norms(path_model(name))
    except NoReference:
        return True


@functools.cache
def _case(name: str) -> dict:
    """One family's tiny model, probe's SAN+skip run and frozen layers, the reference's run."""
    model = path_model(name)
    probed = probe.wrap(model)
    inputs = model_inputs(model)
    data = inputs.get("input_ids", inputs.get("pixel_values"))
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"]
    else:  # an image: the patches and [CLS]
        tokens = (model.config.image_size // model.config.patch_size) ** 2 + 1
        mask = torch.ones(data.shape[0], tokens, dtype=torch.long)
    weights = [probed.adapter.layer_weights(probed.model, i) for i in range(probed.n_layers)]
    run = frozen_run(probed, weights, data, mask)
    if name in TINY_CONFIGS or name in TINY_VARIANTS or name in PATH_VARIANTS:
        # The reference's own SAN+skip run, by module surgery, with the attention probe runs
        # (a float64 softmax where HF's eager computes it in float32).
        attn = reference_attention() if probed.attn_implementation == "probe_eager" else None
        ref = reference_reads(model, inputs, attn)
    else:  # ALBERT, XLNet: code adapters; the reads come from probe's run
        ref = {
            "x0": run["x0"],
            "attn": run["attn"],
            "norm_inputs": run["norm_inputs"],
            "branch_inputs": None,
            "final_input": run["xs"][-1],
            "xs": surgery_reference(model, data, mask, attn_skip=True, mlp=False),
            "output": None,
        }
    reference = FrozenReference(
        model,
        ref["x0"],
        ref["attn"],
        ref["norm_inputs"],
        final_input=ref["final_input"],
        branch_inputs=ref["branch_inputs"],
    )
    return {"model": model, "probed": probed, "run": run, "ref": ref, "reference": reference}


def _close(got: torch.Tensor, want: torch.Tensor, rel: float, what: str) -> None:
    """|got - want| <= rel * max |want| elementwise (want of size O(1))."""
    scale = float(want.abs().max())
    diff = float((got - want).abs().max())
    assert diff <= rel * max(scale, 1.0), f"{what}: off by {diff:.3g} (values {scale:.3g})"


@pytest.mark.parametrize("name", WALKED)
def test_reads_equal_an_independent_san_skip_run(name):
    """Attention, norm inputs and X_l from probe's walk equal the reference surgery's, bitwise."""
    case = _case(name)
    run, ref = case["run"], case["ref"]
    assert len(run["attn"]) == len(ref["attn"]) == case["probed"].n_layers
    for what in ("attn", "norm_inputs", "xs"):
        for layer, (got, want) in enumerate(zip(run[what], ref[what], strict=True)):
            # The same float64 operations on the same inputs: identical bits.
            assert torch.equal(got, want), f"{what} of layer {layer}"
    frozen_branch = [layer.branch_scale is not None for layer in run["layers"]]
    assert all(frozen_branch) == (ref["branch_inputs"] is not None)  # Gemma2's sandwich only


@pytest.mark.parametrize("name", DECOMPOSABLE)
def test_programme_equals_enumeration_of_all_paths(name):
    case = _case(name)
    run, reference = case["run"], case["reference"]
    terms, consts = frozen.path_terms(run["layers"], run["x0"], run["final"])
    expected = reference.by_length()  # enumerates all (H+1)^L paths
    L = case["probed"].n_layers
    assert terms[-1].shape[0] == len(expected) == L + 1
    for k, want in enumerate(expected):
        _close(terms[-1][k], want, ROUNDING, f"paths of length {k}")
    constant = reference.constant()
    if float(constant.abs().max()) == 0.0:
        # No bias and no shift anywhere (Llama without attention_bias, T5, Gemma): every
        # map is linear, so the constant is exactly zero, not merely small.
        assert torch.equal(consts[-1], torch.zeros_like(consts[-1]))
    else:
        _close(consts[-1], constant, ROUNDING, "constant")
        # The constant is not negligible at these weights, so leaving it out would fail.
        assert float(constant.abs().max()) > 1e-2


@pytest.mark.parametrize("name", DECOMPOSABLE)
def test_sum_plus_constant_is_the_frozen_network(name):
    case = _case(name)
    run, reference = case["run"], case["reference"]
    terms, consts = frozen.path_terms(run["layers"], run["x0"], run["final"])
    outputs = frozen.forward(run["layers"], run["x0"], run["final"])
    assert len(terms) == len(outputs)
    for layer, (term, const, out) in enumerate(zip(terms, consts, outputs, strict=True)):
        _close(term.sum(0) + const, out, ROUNDING, f"layer {layer}")
    for layer, (got, want) in enumerate(zip(outputs, reference.outputs(), strict=False)):
        _close(got, want, ROUNDING, f"frozen layer {layer} against the reference's")
    _close(outputs[-1], reference.output(), ROUNDING, "the frozen output")


def _norms_before(model, layer: int) -> int:
    """How many float32 norms the real run applies before X_layer (Gemma2: two per layer)."""
    params = layer_params(model, 0)
    per_layer = (params.norm.kind != "none") + (params.branch is not None)
    return per_layer * layer


@pytest.mark.parametrize("name", DECOMPOSABLE)
def test_frozen_network_equals_the_real_san_skip_run(name):
    case = _case(name)
    model, run, ref = case["model"], case["run"], case["ref"]
    outputs = frozen.forward(run["layers"], run["x0"], None)
    real = ref["xs"]  # the reference's own module surgery
    assert len(real) == len(outputs) == case["probed"].n_layers + 1
    f32 = _float32_norms(model)
    for layer, (got, want) in enumerate(zip(outputs, real, strict=True)):
        bound = F32_PER_NORM * _norms_before(model, layer) if f32 else 0.0
        _close(got, want, ROUNDING + bound, f"layer {layer}")
    if ref["output"] is not None:
        # The model's own output (after its final norm, and OPT-350m's project_out) is the
        # sum of the output's path terms and constant.
        terms, consts = frozen.path_terms(run["layers"], run["x0"], run["final"])
        terms, const = output_terms(run, terms[-1], consts[-1])
        bound = F32_PER_NORM * (_norms_before(model, len(outputs) - 1) + 1) if f32 else 0.0
        _close(terms.sum(0) + const, ref["output"], ROUNDING + bound, "the model's output")
        if final_norm(model) is None and _family(name) != "opt":  # no module after the layers
            assert torch.equal(ref["output"], real[-1])
    if f32:
        # The float32 norms are visible: were they float64, this bound would be too loose.
        worst = max(float((g - w).abs().max()) for g, w in zip(outputs, real, strict=True))
        assert worst > 100 * ROUNDING


class _Float64RMSNorm:
    """An RMS norm of HF's computed entirely in float64 (Gemma's scaling by 1 + w)."""

    def forward(self, x):
        eps = getattr(self, "variance_epsilon", None)
        eps = self.eps if eps is None else eps
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * (1.0 + self.weight) if "Gemma" in type(self).__name__ else y * self.weight


class _Float64CohereLayerNorm:
    """Cohere's bias-free LayerNorm computed entirely in float64."""

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        return centred * torch.rsqrt(variance + self.variance_epsilon) * self.weight


def _float64_norms(model) -> torch.nn.Module:
    """The model with every float32 norm's class swapped for a float64 subclass (same weights)."""
    for module in model.modules():
        cls = type(module)
        if cls.__name__.endswith("RMSNorm") or cls.__name__ == "T5LayerNorm":
            module.__class__ = type(cls.__name__, (_Float64RMSNorm, cls), {})
        elif cls.__name__ == "CohereLayerNorm":
            module.__class__ = type(cls.__name__, (_Float64CohereLayerNorm, cls), {})
    return model


FLOAT32_NORMS = [n for n in WALKED if _collected_float32_norms(n)]


@pytest.mark.parametrize("name", FLOAT32_NORMS)
def test_float64_norms_close_the_float32_gap(name):
    """With float64 RMS norms the frozen network is the real run to float64 rounding."""
    model = _float64_norms(path_model(name))
    assert _float32_norms(model)
    probed = probe.wrap(model)
    inputs = model_inputs(model)
    weights = [probed.adapter.layer_weights(probed.model, i) for i in range(probed.n_layers)]
    run = frozen_run(probed, weights, inputs["input_ids"], inputs["attention_mask"])
    attn = reference_attention() if probed.attn_implementation == "probe_eager" else None
    real = reference_reads(model, inputs, attn)
    outputs = frozen.forward(run["layers"], run["x0"], run["final"])
    for layer, (got, want) in enumerate(zip(outputs, real["xs"], strict=False)):
        _close(got, want, ROUNDING, f"layer {layer}")
    _close(outputs[-1], real["output"], ROUNDING, "the output after the final norm")


def test_path_terms_hand_computed_one_layer():
    """One post-LN layer, one head, hidden 2: V_1[0] = N(x), V_1[1] = N(A x W), K = N(b) + beta."""
    from probe.models.base import LayerWeights

    x = torch.tensor([[[1.0, 3.0], [2.0, -2.0]]], dtype=torch.float64)  # (batch, token, hidden)
    A = torch.tensor([[[[0.5, 0.5], [1.0, 0.0]]]], dtype=torch.float64)  # (batch, head, t, t)
    w = LayerWeights(
        w_v=torch.eye(2, dtype=torch.float64)[None],
        b_v=torch.zeros(1, 2, dtype=torch.float64),
        w_o=torch.eye(2, dtype=torch.float64)[None] * 2,
        b_o=torch.tensor([1.0, 0.0], dtype=torch.float64),
        gamma=torch.ones(2, dtype=torch.float64),
        beta=torch.tensor([0.0, 5.0], dtype=torch.float64),
        eps=0.0,
        norm="post",
    )
    layer = frozen.FrozenLayer(w, A, torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    terms, consts = frozen.path_terms([layer], x)
    # Skip: centre each token, scale by s: token 0 (1,3) -> (-1,1)*0.5; token 1 (2,-2) -> (2,-2)*0.25.
    skip = torch.tensor([[[-0.5, 0.5], [0.5, -0.5]]], dtype=torch.float64)
    # Head: A x = [(1.5, 0.5), (1, 3)], times 2 = [(3, 1), (2, 6)] -> centred [(1,-1), (-2,2)] * s.
    head = torch.tensor([[[0.5, -0.5], [-0.5, 0.5]]], dtype=torch.float64)
    # Constant: b_o = (1, 0) centred (0.5, -0.5) * s, plus beta (0, 5).
    const = torch.tensor([[[0.25, 4.75], [0.125, 4.875]]], dtype=torch.float64)
    torch.testing.assert_close(terms[1][0], skip, rtol=0, atol=0)
    torch.testing.assert_close(terms[1][1], head, rtol=0, atol=0)
    torch.testing.assert_close(consts[1], const, rtol=0, atol=0)


def test_path_terms_hand_computed_rms_gqa_sandwich():
    """One pre-LN layer with an RMS norm, two query heads sharing one value head (grouped-query
    attention) and a frozen RMS norm on the heads' output (Gemma2's sandwich), hidden 2."""
    from probe.models.base import LayerWeights

    x = torch.tensor([[[3.0, 4.0], [1.0, 0.0]]], dtype=torch.float64)
    # Head 0 attends to itself, head 1 to token 0: (batch, head, token, token).
    A = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]]], dtype=torch.float64)
    w_v = torch.eye(2, dtype=torch.float64)[None].repeat(2, 1, 1)  # the one value head, repeated
    w = LayerWeights(
        w_v=w_v,
        b_v=torch.zeros(2, 2, dtype=torch.float64),
        w_o=torch.stack([torch.eye(2), 2 * torch.eye(2)]).to(torch.float64),
        b_o=torch.zeros(2, dtype=torch.float64),
        gamma=torch.tensor([2.0, 1.0], dtype=torch.float64),
        beta=torch.zeros(2, dtype=torch.float64),
        eps=0.0,
        norm="pre",
        kind="rms",
        branch_gamma=torch.tensor([1.0, 0.5], dtype=torch.float64),
        branch_eps=0.0,
        branch_kind="rms",
    )
    # 1/rms of the inputs: token 0 (3,4): rms sqrt(12.5); token 1 (1,0): rms sqrt(0.5).
    s = torch.tensor([[12.5**-0.5, 0.5**-0.5]], dtype=torch.float64)
    t = torch.tensor([[0.5, 0.25]], dtype=torch.float64)  # the branch norm's 1/rms, given
    layer = frozen.FrozenLayer(w, A, s, t)
    terms, consts = frozen.path_terms([layer], x)
    n = x * s[..., None] * w.gamma  # N(x), no centring: [(6,4)/sqrt(12.5), (2,0)/sqrt(0.5)]
    heads = A[0, 0] @ n[0] + 2 * (A[0, 1] @ n[0])  # head 0 + head 1 (w_o 2I)
    want = (heads * t[0, :, None] * w.branch_gamma)[None]
    torch.testing.assert_close(terms[1][0], x, rtol=0, atol=0)  # the skip path is x itself
    torch.testing.assert_close(terms[1][1], want, rtol=0, atol=4 * EPS * float(want.abs().max()))
    assert torch.equal(consts[1], torch.zeros_like(x))  # no bias, no beta: no constant


@pytest.mark.parametrize("name", DECOMPOSABLE)
def test_dataset_is_consistent(name):
    model = path_model(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ds = paths.decompose(model, init="pretrained", sequences=3, tokens=6, batch_size=2)
    for k, v in model.state_dict().items():  # the user's model is never modified
        assert torch.equal(v, before[k])
    L, H = ds.sizes["layer"] - 1, int(ds.attrs["n_heads"])
    assert ds.sizes["layer"] == ds.sizes["path_length"] == L + 1
    last = ds.sel(init="pretrained", layer=L)
    # Shares of a layer sum to 1 (a ratio of float sums: rounding only).
    assert float(abs(last["share"].sum("path_length") - 1).max()) < ROUNDING
    # Keeping every path reproduces the layer (rounding only).
    assert float(last["truncation_error"].sel(path_length=L).max()) < ROUNDING
    # ... and the real run (float32 rounding where HF's RMS norms compute in float32).
    f32 = F32_PER_NORM * 2 * (L + 1) if _float32_norms(model) else 0.0
    assert float(ds["reconstruction_error"].max()) < ROUNDING + f32
    assert float(ds["cosine"].sel(path_length=L).min()) == pytest.approx(1.0, abs=ROUNDING)
    eff = ds["effective_length"].sel(init="pretrained")
    assert bool(((eff >= 0) & (eff <= ds.layer)).all())
    # The uniform shares are the binomial counts: layer 2: 1, 2H, H^2 over (H+1)^2.
    share = [1 / (H + 1) ** 2, 2 * H / (H + 1) ** 2, H**2 / (H + 1) ** 2]
    assert ds["uniform_share"].sel(layer=2).values[:3] == pytest.approx(share, rel=1e-15)
    if ADAPTERS[_family(name)].lm_head(model) is not None:
        # float32 logits: the loss keeping every path is the real one to float32 rounding.
        assert float(abs(ds["loss"].sel(path_length=L) - ds["loss_full"]).max()) < 1e-5
        assert ds.attrs["task"] == "loss"
    else:
        assert "loss" not in ds and ds.attrs["task"] == "cosine"
    assert "SAN+skip" in ds.attrs["frozen"]
    assert ("1/rms" in ds.attrs["frozen"]) == _rms_norms(model)


# The report is the same code for every family (drawing costs seconds): one with the loss,
# one post-LN with the cosine, one vision model.
@pytest.mark.parametrize("name", ["llama-bias-tied", "opt-post-ln", "vit"])
def test_report_of_a_decomposition(name):
    ds = paths.decompose(path_model(name), init="pretrained", sequences=2, tokens=6)
    html = render_paths(ds, result_file="x.nc")
    meta = read_meta(html)
    assert meta["analysis"] == "paths-decompose" and meta["family"] == _family(name)
    assert html.count("<svg") == 2 + ds.sizes["init"]  # shares per init; errors; lengths


@pytest.mark.parametrize("name", REFUSED)
def test_families_without_a_decomposition_refuse_in_one_line(name):
    with pytest.raises(ProbeError, match="path decomposition: ") as err:
        paths.decompose(path_model(name), init="pretrained", sequences=2, tokens=6)
    assert "\n" not in str(err.value) and ADAPTERS[_family(name)].not_decomposable in str(err.value)


TIED = [n for n in DECOMPOSABLE if ADAPTERS[_family(n)].lm_head(path_model(n)) is not None]


@pytest.mark.parametrize("name", TIED)
def test_lm_loss_is_the_causal_lm_loss(name):
    """The task measure's loss equals the family's own *ForCausalLM loss on the same weights:
    the head is the tied embedding, and the logits are what the family's LM makes of them
    (Cohere's logit_scale, Granite's logits_scaling, Gemma2's soft cap: the entry's logits)."""
    import transformers

    model = path_model(name)
    lm = transformers.AutoModelForCausalLM.from_config(
        model.config, attn_implementation="eager"
    ).to(torch.float64)
    missing, unexpected = lm.base_model.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    lm.eval()
    assert torch.equal(lm.get_output_embeddings().weight, lm.get_input_embeddings().weight)
    inputs = model_inputs(model, batch=2, tokens=9)
    ids = inputs["input_ids"]
    forward = {"use_cache": False}
    with torch.no_grad():
        want = float(lm(**inputs, labels=ids, **forward).loss)
        hidden = model(**inputs, **forward).last_hidden_state
    adapter = ADAPTERS[_family(name)]
    head = adapter.lm_head(model)
    to_logits = logit_map(adapter, model.config)
    got = lm_loss(hidden[None], head, ids, to_logits)[0]
    # Both compute the cross-entropy of float32 logits (HF upcasts): a few float32 ulps.
    assert float(got.mean()) == pytest.approx(want, abs=1e-6)
    if to_logits is not None:  # without the family's logits the loss is measurably different
        assert abs(float(lm_loss(hidden[None], head, ids)[0].mean()) - want) > 1e-4


def test_cli_decompose_writes_result_report_and_index(tiny_folders, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "paths",
            "--decompose",
            tiny_folders["gpt2"],
            "--init",
            "random",
            "--sequences",
            "2",
            "--tokens",
            "8",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "effective path length" in result.output
    html = sorted(tmp_path.glob("paths-decompose-*.html"))
    assert len(html) == 1 and html[0].with_suffix(".nc").is_file()
    assert html[0].name in (tmp_path / "index.html").read_text()


def test_decompose_errors(tiny_folders, tmp_path):
    with pytest.raises(ProbeError, match="tokens"):
        paths.decompose(tiny_folders["bert"], init="random", tokens=1000)
    result = CliRunner().invoke(app, ["paths", "--decompose", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "needs a MODEL" in result.output


def test_cli_decompose_a_saved_tiny_qwen3_with_the_defaults(tmp_path, monkeypatch):
    """The README's `probe paths --decompose ./tiny-qwen3`: a save_pretrained folder, offline,
    both inits, 8 sequences of 128 synthetic tokens (no tokenizer in the folder), float64."""
    import transformers

    name, kwargs = TINY_CONFIGS["qwen3"]
    config = getattr(transformers, name)(**{**kwargs, "max_position_embeddings": 256})
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(tmp_path / "tiny-qwen3")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["paths", "--decompose", "./tiny-qwen3", "--out", "out"])
    assert result.exit_code == 0, result.output
    assert "effective path length" in result.output
    [html] = sorted((tmp_path / "out").glob("paths-decompose-*.html"))
    ds = probe.open_result(html.with_suffix(".nc"))
    assert list(ds.init.values) == ["pretrained", "random"]
    assert (ds.sizes["sequence"], ds.attrs["tokens"], ds.attrs["dtype"]) == (8, 128, "float64")
    assert ds.attrs["family"] == "qwen3" and "1/rms" in ds.attrs["frozen"]
    # Every path kept gives back the frozen network; it is the real run up to HF's float32
    # RMS norms (3 layers, each norm a few float32 ulps).
    assert float(ds["truncation_error"].sel(layer=3, path_length=3).max()) < ROUNDING
    assert float(ds["reconstruction_error"].max()) < F32_PER_NORM * 4
    meta = read_meta(html.read_text())
    assert meta["analysis"] == "paths-decompose"


def test_a_decomposition_holds_the_token_ids_that_ran():
    model = path_model("gpt2")
    ids = torch.randint(3, 80, (3, 6), generator=torch.Generator().manual_seed(1))
    ds = paths.decompose(model, probe.Inputs(ids=ids, batch_size=2), init="pretrained")
    np.testing.assert_array_equal(ds["input_ids"].values, ids.numpy())
    assert ds["input_ids"].dims == ("sequence", "token")
    vit = paths.decompose(path_model("vit"), init="pretrained", sequences=2)
    assert "input_ids" not in vit  # pixels: the inputs' description is in the attributes
