"""probe paths --sample: attention from the adapters, products along paths, the Dataset and CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import probe
from probe.analyses import paths
from probe.analyses.path_sample import attention_slices, chain, draw
from probe.cli.app import app
from probe.paths import SKIP, parse_path, path_length
from probe.reports.index import read_meta
from probe.reports.paths_report import render_paths
from tests.paths_tiny import ids, tiny_paths_model
from tests.reference import metrics_numpy
from tests.reference.tiny import FAMILIES


def _hf_attentions(model, batch, family):
    """(layer, batch, head, token, token) from HuggingFace's own output_attentions."""
    # One-shot forwards, as probe makes them: no memory (XLNet), no key/value cache (GPT-2).
    kwargs = {"xlnet": {"use_mems": False}, "gpt2": {"use_cache": False}}.get(family, {})
    with torch.no_grad():
        out = model(batch, output_attentions=True, **kwargs)
    return torch.stack(list(out.attentions))


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_attention_equals_output_attentions(family):
    model = tiny_paths_model(family)
    probed = probe.wrap(model)
    batch = ids()
    every = [[(s, h) for s in range(2) for h in range(2)] for _ in range(3)]
    slices = attention_slices(probed, batch, torch.ones_like(batch), every)
    want = _hf_attentions(model, batch, family)
    for layer in range(3):
        for n, (s, h) in enumerate(every[layer]):
            # The same float64 kernels on the same inputs: identical bits.
            torch.testing.assert_close(slices[layer][n], want[layer, s, h], rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_products_stay_row_stochastic_and_match_an_independent_product(family):
    model = tiny_paths_model(family)
    probed = probe.wrap(model)
    batch = ids()
    chosen = [((0, SKIP, 1), 0), ((1, 0, 1), 1), ((SKIP, SKIP, 0), 1)]
    products = chain(probed, batch, torch.ones_like(batch), chosen)
    # Rows of a product of row-stochastic matrices sum to 1: at most 3 products of 7 terms,
    # each rounding by ~1e-16, so 1e-14 is rounding with a margin.
    torch.testing.assert_close(
        products.sum(-1), torch.ones(3, 7, dtype=torch.float64), rtol=0, atol=1e-14
    )
    assert float(products.min()) >= 0
    A = _hf_attentions(model, batch, family).numpy()
    for product, (path, seq) in zip(products.numpy(), chosen, strict=True):
        expected = np.eye(7)
        for layer, head in enumerate(path):
            if head is not SKIP:
                expected = A[layer, seq, head] @ expected  # latest layer on the left
        # Same products in another order of evaluation (numpy): entries <= 1, a few ulps apart.
        np.testing.assert_allclose(product, expected, rtol=0, atol=1e-15)
    if family == "gpt2":  # causal: the product stays lower-triangular
        assert torch.equal(products, torch.tril(products))


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
    assert float(ds["ratio"].sel(fit="mean").max()) == 0.0


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
    assert ds["ratio"].dims == ("init", "depth", "sample", "fit", "norm")
    # Rebuild one sample from its coordinates and an independent numpy metric.
    one = ds.isel(depth=1, sample=2)
    path, seq = parse_path(str(one["path"].values)), int(one["sequence"].values)
    inputs = probe.inputs.make_inputs(None, 80, sequences=3, tokens=6, seed=3)
    probed = probe.wrap(model)
    [product] = chain(probed, inputs.input_ids, inputs.attention_mask, [(path, seq)])
    for fit in ("mean", "svd"):
        want = metrics_numpy.relative_residual(product[None].numpy(), norm="l1inf", fit=fit)[0]
        got = float(one["ratio"].sel(init="pretrained", fit=fit, norm="l1inf"))
        assert got == pytest.approx(want, rel=1e-10)  # SVD vs numpy SVD: rounding only


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
    assert "fitted order" in result.output
    [html] = sorted(tmp_path.glob("paths-sample-*.html"))
    assert html.with_suffix(".nc").is_file()
    assert html.name in (tmp_path / "index.html").read_text()
    ds = probe.open_result(html.with_suffix(".nc"))
    meta = read_meta(render_paths(ds, result_file="x.nc"))
    assert meta["analysis"] == "paths-sample" and meta["init"] == "random"
