"""probe paths --sample on every family in the registry: attention probabilities from the
walk against HF's own ``output_attentions``, products along paths, the Dataset and CLI.

The families come from ``probe.models.ADAPTERS`` and the config branches of the tiny
models, so a new family is covered as soon as it has its entry and its tiny config.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import probe
from probe.analyses import paths
from probe.analyses.path_sample import attention_slices, chain, chains, draw
from probe.cli.app import app
from probe.figures.plot_paths import fit_decay
from probe.measures.path_vocabulary import SKIP, parse_path, path_length
from probe.models import ADAPTERS, SpecAdapter
from probe.reports.index import read_meta
from probe.reports.paths_report import render_paths
from tests.paths_tiny import (
    PATH_VARIANTS,
    ids,
    model_inputs,
    one_thread,  # noqa: F401  (autouse: one torch thread here)
    path_model,
    tiny_paths_model,
)
from tests.reference import metrics_numpy
from tests.reference.attention import register as reference_attention
from tests.reference.tiny import TINY_VARIANTS

REGISTRY = sorted(ADAPTERS)


U32 = 2.0**-24  # float32's unit roundoff
#: Every tiny model the path tests know: each family of the registry and each config branch.
#: The Fastformer has no attention probabilities for HF to return: its pooling matrices are
#: checked against its own reference in test_fastformer_paths.py.
NAMES = [n for n in REGISTRY + sorted(TINY_VARIANTS) + sorted(PATH_VARIANTS) if n != "fastformer"]


def _family(name: str) -> str:
    return {**TINY_VARIANTS, **PATH_VARIANTS}.get(name, (name,))[0]


def _hf_attentions(model, inputs, attn: str | None = None):
    """(layer, batch, head, token, token) from HuggingFace's own output_attentions, run with
    attention ``attn`` (default: the model's) on a copy."""
    work = copy.deepcopy(model)
    if attn is not None:
        work.config._attn_implementation = attn
    # One-shot forwards, as probe makes them: no memory (XLNet), no key/value cache.
    kwargs = {}
    if work.config.model_type == "xlnet":
        kwargs = {"use_mems": False}
    elif "use_cache" in inspect.signature(work.forward).parameters:
        kwargs = {"use_cache": False}
    with torch.no_grad():
        out = work(**inputs, output_attentions=True, **kwargs)
    return torch.stack(list(out.attentions))


def _batch(model):
    inputs = model_inputs(model)
    data = inputs.get("input_ids", inputs.get("pixel_values"))
    mask = inputs.get("attention_mask")
    if mask is None:  # an image: the patches and [CLS]
        tokens = (model.config.image_size // model.config.patch_size) ** 2 + 1
        mask = torch.ones(data.shape[0], tokens, dtype=torch.long)
    return inputs, data, mask


@pytest.mark.parametrize("name", NAMES)
def test_attention_equals_output_attentions(name):
    model = path_model(name)
    probed = probe.wrap(model)
    inputs, data, mask = _batch(model)
    hf = _hf_attentions(model, inputs)
    L, B, H = hf.shape[:3]
    every = [[(s, h) for s in range(B) for h in range(H)] for _ in range(L)]
    slices = attention_slices(probed, data, mask, every)
    got = torch.stack([x.reshape(B, H, *x.shape[-2:]) for x in slices])
    if probed.attn_implementation == "eager":
        # HF's eager keeps float64 here: the same kernels on the same inputs, identical bits.
        assert torch.equal(got, hf)
        return
    # HF's eager computes this family's softmax in float32; probe keeps float64.  The same
    # computation in float64 (the reference's own attention function) gives identical bits,
    assert probed.attn_implementation == "probe_eager"
    assert torch.equal(got, _hf_attentions(model, inputs, reference_attention()))
    # and HF's float32 softmax is within a few float32 ulps of it (scores of size up to ~10
    # lose |score| ulps in the cast: measured 13 ulps at most, in Gemma2).
    assert float((got - hf).abs().max()) <= 32 * U32


def _paths(L: int, H: int) -> list:
    """Three paths of the model's shape: the first and last layer; every layer; the last only."""
    first_last = tuple(0 if i == 0 else 1 % H if i == L - 1 else SKIP for i in range(L))
    every = tuple(i % H for i in range(L))
    last = tuple(SKIP if i < L - 1 else H - 1 for i in range(L))
    return [(first_last, 0), (every, 1), (last, 1)]


@pytest.mark.parametrize("name", NAMES)
def test_products_are_row_stochastic_and_match_an_independent_product(name):
    model = path_model(name)
    probed = probe.wrap(model)
    inputs, data, mask = _batch(model)
    attn = reference_attention() if probed.attn_implementation == "probe_eager" else None
    A = _hf_attentions(model, inputs, attn)
    L, _, H, T, _ = A.shape
    chosen = _paths(L, H)
    products = chain(probed, data, mask, chosen)
    # Rows of a product of row-stochastic matrices sum to 1: at most 3 products of <= 17
    # terms, each rounding by ~1e-16, so 1e-14 is rounding with a margin.  BLOOM computes
    # its softmax in float32 whatever the model's dtype (its attention never calls probe's):
    # its own rows sum to 1 only to float32 rounding, and a product of L of them to L times it.
    stochastic = float((A.sum(-1) - 1).abs().max())
    atol = 1e-14 if stochastic < 1e-15 else 1e-14 + L * stochastic
    torch.testing.assert_close(
        products.sum(-1), torch.ones(3, T, dtype=torch.float64), rtol=0, atol=atol
    )
    assert float(products.min()) >= 0
    earliest, latest = chains(probed, data, mask, chosen)
    assert torch.equal(latest, products)
    for n, (path, seq) in enumerate(chosen):
        along = [A[layer, seq, head].numpy() for layer, head in enumerate(path) if head is not SKIP]
        expected_latest, expected_earliest = np.eye(T), np.eye(T)
        for a in along:
            expected_latest = a @ expected_latest  # latest layer on the left
            expected_earliest = expected_earliest @ a  # the paper's notebook: earliest on the left
        # Same products in another order of evaluation (numpy): entries <= 1, a few ulps apart.
        np.testing.assert_allclose(products[n].numpy(), expected_latest, rtol=0, atol=1e-15)
        np.testing.assert_allclose(earliest[n].numpy(), expected_earliest, rtol=0, atol=1e-15)
    causal = bool((A.triu(1) == 0).all())  # HF's own attention says whether it is causal
    adapter = ADAPTERS[_family(name)]
    if isinstance(adapter, SpecAdapter):  # the spec's flag agrees with the attention itself
        assert causal == adapter.spec.causal
    if causal:  # a product of lower-triangular matrices stays lower-triangular, exactly
        assert torch.equal(products, torch.tril(products))
    else:
        assert not torch.equal(products, torch.tril(products))


@pytest.mark.parametrize("name", NAMES)
def test_sample_dataset_on_every_family(name):
    model = path_model(name)
    ds = paths.sample(model, samples=3, sequences=2, tokens=6, init="pretrained", seed=1)
    L = ds.sizes["depth"]
    assert ds["ratio"].dims == ("init", "order", "depth", "sample", "fit", "norm")
    assert bool(np.isfinite(ds["ratio"]).all()) and float(ds["ratio"].min()) >= 0
    assert ds.attrs["family"] == _family(name) and ds.attrs["n_layers"] == L
    if model.config.model_type == "vit":  # seeded noise images, the model's own token count
        assert ds.attrs["inputs"] == "seeded noise pixels" and ds.attrs["tokens"] == 17
        assert "input_ids" not in ds  # pixels have no token ids; the attr describes them
    else:
        assert ds["input_ids"].shape == (2, 6) and int(ds["input_ids"].min()) >= 0


def test_uniform_attention_gives_exactly_rank_one():
    model = tiny_paths_model("bert")
    with torch.no_grad():
        for layer in model.encoder.layer:
            for proj in (layer.attention.self.query, layer.attention.self.key):
                proj.weight.zero_()
                proj.bias.zero_()
    # Scores are all 0, so softmax gives exactly 1/8 (a power of two), and so does every product.
    batch = ids(tokens=8)
    products = chain(probe.wrap(model), batch, torch.ones_like(batch), [((0, 1, 0), 0)])
    assert torch.equal(products[0], torch.full((8, 8), 1 / 8, dtype=torch.float64))
    ds = paths.sample(model, samples=4, sequences=2, tokens=8, init="pretrained")
    assert list(ds.order.values) == ["earliest-left", "latest-left"]
    assert float(ds["ratio"].sel(fit="mean").max()) == 0.0  # both orders


def test_draw_is_seeded_and_uniform_over_depth():
    a, b = draw(4, 3, 50, 5, seed=7), draw(4, 3, 50, 5, seed=7)
    assert a == b and draw(4, 3, 50, 5, seed=8) != a
    for depth, row in enumerate(a, start=1):
        assert all(path_length(p) == depth and 0 <= q < 5 for p, q in row)


def test_dataset_coordinates_reproduce_each_sample():
    model = tiny_paths_model("albert")
    ds = paths.sample(model, samples=5, sequences=3, tokens=6, init="pretrained", seed=3)
    again = paths.sample(model, samples=5, sequences=3, tokens=6, init="pretrained", seed=3)
    np.testing.assert_array_equal(ds["ratio"].values, again["ratio"].values)
    assert ds["ratio"].dims == ("init", "order", "depth", "sample", "fit", "norm")
    # Rebuild one sample from its coordinates and an independent numpy metric.
    one = ds.isel(depth=1, sample=2)
    path, seq = parse_path(str(one["path"].values)), int(one["sequence"].values)
    inputs = probe.requests.inputs.make_inputs(None, 80, sequences=3, tokens=6, seed=3)
    # The result holds the token ids it ran, as the inputs were made (no padding here).
    assert ds["input_ids"].dims == ("input_sequence", "token")
    np.testing.assert_array_equal(ds["input_ids"].values, inputs.input_ids.numpy())
    probed = probe.wrap(model)
    for order in ("earliest-left", "latest-left"):
        [product] = chain(probed, inputs.input_ids, inputs.attention_mask, [(path, seq)], order)
        for fit in ("mean", "svd"):
            want = metrics_numpy.relative_residual(product[None].numpy(), norm="l1inf", fit=fit)[0]
            got = float(one["ratio"].sel(init="pretrained", order=order, fit=fit, norm="l1inf"))
            assert got == pytest.approx(want, rel=1e-10)  # SVD vs numpy SVD: rounding only


def test_the_headline_is_the_papers_quantity():
    """fit_decay, the box plot and the table default to the distance to the best rank-one
    fit of the product with the earliest layer on the left (the paper's notebook)."""
    model = tiny_paths_model("bert")
    ds = paths.sample(model, samples=7, sequences=3, tokens=6, init="pretrained", seed=1)
    median = ds["ratio"].sel(fit="svd", order="earliest-left", norm="l1inf").median("sample")
    np.testing.assert_array_equal(fit_decay(ds)["median"].values, median.values)
    other = ds["ratio"].sel(fit="mean", order="earliest-left", norm="l1inf").median("sample")
    assert not np.array_equal(median.values, other.values)
    html = render_paths(ds, result_file="x.nc")
    assert "Headline: the distance to the best rank-one fit (SVD)" in html
    # The table: the SVD row first, the mean-row row beside it, per init.
    assert html.index("best rank-one fit (SVD)</td>") < html.index("mean row, 1p<sup>T</sup></td>")
    assert "latest-left" in html  # the other order, labelled, in its own table


def test_cli_sample_writes_result_report_and_index(tiny_folders, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "paths",
            "--sample",
            tiny_folders["xlnet"],
            "--init",
            "random",
            "--samples",
            "6",
            "--sequences",
            "2",
            "--tokens",
            "8",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "random: SVD distance" in result.output and "mean-row distance" in result.output
    assert "median ||P - rank1_SVD(P)|| / ||P|| (l1inf)" in result.output
    assert "random SVD" in result.output and "random mean row" in result.output
    [html] = sorted(tmp_path.glob("paths-sample-*.html"))
    assert html.with_suffix(".nc").is_file()
    assert html.name in (tmp_path / "index.html").read_text()
    ds = probe.open_result(html.with_suffix(".nc"))
    meta = read_meta(render_paths(ds, result_file="x.nc"))
    assert meta["analysis"] == "paths-sample" and meta["init"] == "random"
