"""The fastformer adapter: hook ablations against the reference, pooling matrices, loading, CLI."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import probe
from cli.app import app
from probe.analyses import collapse
from probe.models.fastformer import attention_probs, strict_skip
from probe.requests.inputs import make_inputs
from tests.fastformer_tiny import tiny_config, tiny_fastformer, write_shared_format
from tests.reference import fastformer as ref
from tests.reference import metrics_numpy

# float64 throughout: the hooks replace the residual terms by exact zeros, and the
# reference differs from the model only in the order of its sums (explicit softmax
# per row against blocked running sums): ~1e-15 per value, 1e-12 after 3 layers.
TOL = 1e-12
CASES = [
    ("SAN", False),
    ("SAN+MLP", False),
    ("SAN+skip", False),
    ("transformer", False),
    ("SAN", True),
    ("SAN+MLP", True),
]


def _ids(seed=0, batch=3, tokens=11):
    return torch.randint(1, 80, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _reference(model, ids, ablation, strict, mask=None, pooling=None):
    sd = {k: v.double() for k, v in model.state_dict().items()}
    config = {k: getattr(model.config, k) for k in tiny_config()}
    return ref.forward(
        sd,
        config,
        ids,
        mask,
        attn_skip=ablation.attn_skip,
        strict=strict,
        mlp=ablation.mlp,
        pooling=pooling,
    )[1]


@pytest.mark.parametrize("convolve", [False, True])
@pytest.mark.parametrize(("variant", "strict"), CASES)
def test_hooks_equal_reference_surgery(variant, strict, convolve):
    model = tiny_fastformer(seed=1, convolve=convolve, groups=2)
    probed = probe.wrap(model)
    if strict:
        probed = strict_skip(probed)
    ablation = probe.PRESETS[variant]
    ids = _ids()
    got = probe.hidden_states(probed, ids, ablation)
    want = _reference(model, ids, ablation, strict)
    assert len(got) == len(want) == 4
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, atol=TOL, rtol=0, msg=f"{variant} {strict} layer {layer}")


def _zero(module, *args, **kwargs):
    return torch.zeros_like(args[0])


@pytest.mark.parametrize(("variant", "strict"), CASES)
def test_hooks_equal_module_surgery_bitwise(variant, strict):
    """The same ablation done by replacing modules of a copy: identical bits."""
    model = tiny_fastformer(seed=2)
    ablation = probe.PRESETS[variant]
    surgery = copy.deepcopy(model)
    for layer in surgery.fastformer_model.decoders:
        if not ablation.attn_skip:
            layer.attention.skip.forward = lambda h: torch.zeros_like(h)
            if strict:
                layer.attention.mid_skip.forward = lambda r: torch.zeros_like(r)
        if not ablation.mlp:
            layer.unboom.forward = lambda z: torch.zeros(*z.shape[:-1], 32, dtype=z.dtype)
    ids = _ids(1)
    with torch.no_grad():
        want = surgery(ids, output_hidden_states=True).hidden_states
    probed = probe.wrap(model)
    got = probe.hidden_states(strict_skip(probed) if strict else probed, ids, ablation)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_strict_differs_from_standard_no_skip():
    probed = probe.wrap(tiny_fastformer(seed=3))
    ids = _ids(2)
    standard = probe.hidden_states(probed, ids, probe.SAN)
    strict = probe.hidden_states(strict_skip(probed), ids, probe.SAN)
    assert (standard[-1] - strict[-1]).abs().max() > 1e-3
    # strict_skip shares the model and its nnsight wrapper; the original is unchanged.
    assert strict_skip(probed).model is probed.model
    assert not probed.adapter.strict


def test_residual_stream_is_output_hidden_states_and_model_is_untouched():
    model = tiny_fastformer(seed=4)
    fresh = tiny_fastformer(seed=4)
    ids = _ids(3)
    probed = probe.wrap(model)
    for variant in probe.VARIANTS:
        probe.hidden_states(probed, ids, probe.PRESETS[variant])
    with torch.no_grad():
        hf = fresh(ids, output_hidden_states=True).hidden_states
        again = model(ids, output_hidden_states=True).hidden_states
    got = probe.hidden_states(probed, ids)
    for g, h, a in zip(got, hf, again, strict=True):
        assert torch.equal(g, h) and torch.equal(a, h)
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("variant", ["transformer", "SAN"])
def test_attention_probs_equal_reference_matrices(variant):
    model = tiny_fastformer(seed=5)
    ids = _ids(4, batch=2, tokens=9)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    ablation = probe.PRESETS[variant]
    got = attention_probs(probe.wrap(model), ids, mask, ablation)
    pooling: list = []
    _reference(model, ids, ablation, False, mask, pooling)
    assert len(got) == len(pooling) == 3
    for layer, (g, (query, key)) in enumerate(zip(got, pooling, strict=True)):
        for name, want in (("query", query), ("key", key)):
            a = g[name]
            assert a.shape == (2, 4, 9, 9)
            torch.testing.assert_close(a, want, atol=TOL, rtol=0, msg=f"{layer} {name}")
            assert torch.equal(a, a.tril())
            torch.testing.assert_close(a.sum(-1), torch.ones(2, 4, 9, dtype=a.dtype))


# --- loading, the collapse analysis and the CLI on folders ---------------------------


@pytest.fixture(scope="module")
def shared_folder(tmp_path_factory):
    """A shared-format folder (pytorch_model.bin, no n_heads) with a character tokenizer."""
    from probe.fastformer.tokenizer import char_tokenizer

    folder = tmp_path_factory.mktemp("ff") / "tiny-fastformer"
    config = tiny_config()
    del config["n_heads"]
    write_shared_format(folder, config, seed=6, dtype=torch.float32)
    text = "".join(chr(c) for c in range(32, 32 + 78))  # 78 characters + <pad>, <unk> = 80
    char_tokenizer(text).save_pretrained(folder)
    return folder


def test_probe_load_reads_the_shared_format_with_its_tokenizer(shared_folder):
    probed = probe.load(shared_folder)
    assert probed.family == "fastformer" and probed.n_layers == 3
    assert probed.tokenizer is not None and len(probed.tokenizer) == 80
    sd = torch.load(shared_folder / "pytorch_model.bin", weights_only=True)
    for name, value in probed.model.state_dict().items():
        assert torch.equal(value, sd[name]), name
    random = probe.load(shared_folder, init="random", seed=1)
    assert not torch.equal(random.model.word_embedding.weight, probed.model.word_embedding.weight)


def test_collapse_run_equals_reference_metrics(shared_folder):
    ds = collapse.run(shared_folder, init="pretrained", dtype="float64", sequences=2, tokens=10)
    assert ds.attrs["family"] == "fastformer"
    assert json.loads(ds.attrs["ablation_table"])[1]["ablation"] == "no skip (strict)"
    probed = probe.load(shared_folder, dtype="float64")
    # The same inputs as run(): the sample text through the folder's tokenizer.
    inputs = make_inputs(probed.tokenizer, 80, sequences=2, tokens=10)
    model = probed.model
    for variant in probe.VARIANTS:
        states = _reference(model, inputs.input_ids, probe.PRESETS[variant], False)
        for layer, x in enumerate(states):
            want = metrics_numpy.collapse_metrics(x.numpy())
            got = ds.sel(init="pretrained", variant=variant, layer=layer)
            for name, value in want.items():
                # float64 metrics of hidden states equal to 1e-12: SVD-based values to ~1e-9.
                np.testing.assert_allclose(got[name].values, value, rtol=1e-7, atol=1e-9)


def test_cli_collapse_no_skip_on_a_fastformer_folder(shared_folder, tmp_path):
    result = CliRunner().invoke(
        app,
        ["collapse", str(shared_folder), "--no-skip", "--sequences", "2", "--tokens", "8",
         "--out", str(tmp_path)],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in tmp_path.iterdir())
    assert any(f.endswith(".nc") for f in files) and any(f.endswith(".html") for f in files)
    nc = next(tmp_path.glob("collapse-*.nc"))
    ds = probe.open_result(nc)
    assert list(ds.variant.values) == ["SAN+MLP"] and ds.attrs["family"] == "fastformer"


class _Payload:
    """Any non-tensor object: a pickle that weights_only loading must refuse."""


def test_a_pickled_object_in_pytorch_model_bin_is_refused(tmp_path):
    folder = tmp_path / "evil"
    config = tiny_config()
    sd = write_shared_format(folder, config, dtype=torch.float32)
    torch.save({**sd, "extra": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(probe.ProbeError, match="cannot load pretrained weights"):
        probe.load(folder)
