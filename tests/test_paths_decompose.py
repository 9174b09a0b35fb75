"""probe paths --decompose: the programme against brute-force enumeration, the frozen network
against the real SAN+skip run, the Dataset, the report and the CLI."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import probe
from probe import frozen
from probe.analyses import paths
from probe.analyses.path_decompose import frozen_run
from probe.cli.app import app
from probe.errors import ProbeError
from probe.reports.index import read_meta
from probe.reports.paths_report import render_paths
from tests.paths_tiny import ids, tiny_paths_model
from tests.reference.path_enumeration import FrozenReference
from tests.reference.surgery import reference_hidden_states
from tests.reference.tiny import FAMILIES

# Every comparison below is float64 arithmetic on O(1) values through 3 layers: rounding
# stays near 1e-15, so 1e-10 (the bar) leaves a wide margin and still fails on
# any real mistake (a missing bias or a misplaced LayerNorm moves values by ~1e-1).
TOL = 1e-10


def _run(family):
    model = tiny_paths_model(family)
    probed = probe.wrap(model)
    weights = [probed.adapter.layer_weights(model, i) for i in range(probed.n_layers)]
    batch = ids()
    return model, batch, frozen_run(probed, weights, batch, torch.ones_like(batch))


@pytest.mark.parametrize("family", FAMILIES)
def test_programme_equals_enumeration_of_all_paths(family):
    model, _, run = _run(family)
    terms, consts = frozen.path_terms(run["layers"], run["x0"], run["final"])
    reference = FrozenReference(
        model, run["x0"], run["attn"], run["norm_inputs"], final_input=run["xs"][-1]
    )
    expected = reference.by_length()  # enumerates (2+1)^3 = 27 paths
    assert terms[-1].shape[0] == len(expected) == 4
    for k, want in enumerate(expected):
        torch.testing.assert_close(terms[-1][k], want, rtol=0, atol=TOL)
    torch.testing.assert_close(consts[-1], reference.constant(), rtol=0, atol=TOL)
    # The constant is not negligible at these weights, so leaving it out would fail.
    assert float(reference.constant().abs().max()) > 1e-2


@pytest.mark.parametrize("family", FAMILIES)
def test_sum_plus_constant_is_the_frozen_network(family):
    model, _, run = _run(family)
    terms, consts = frozen.path_terms(run["layers"], run["x0"], run["final"])
    outputs = frozen.forward(run["layers"], run["x0"], run["final"])
    assert len(terms) == len(outputs)
    for term, const, out in zip(terms, consts, outputs, strict=True):
        torch.testing.assert_close(term.sum(0) + const, out, rtol=0, atol=TOL)
    reference = FrozenReference(
        model, run["x0"], run["attn"], run["norm_inputs"], final_input=run["xs"][-1]
    )
    torch.testing.assert_close(outputs[-1], reference.output(), rtol=0, atol=TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_frozen_network_equals_real_san_skip(family):
    model, batch, run = _run(family)
    real = reference_hidden_states(model, batch, attn_skip=True, mlp=False)  # module surgery
    outputs = frozen.forward(run["layers"], run["x0"], None)
    assert len(real) == len(outputs) == 4
    for got, want in zip(outputs, real, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    if family == "gpt2":  # ln_f is part of GPT-2's output
        final = frozen.forward(run["layers"], run["x0"], run["final"])[-1]
        ln_f = model.ln_f(real[-1])
        torch.testing.assert_close(final, ln_f, rtol=0, atol=TOL)


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


@pytest.mark.parametrize("family", FAMILIES)
def test_dataset_is_consistent(family):
    model = tiny_paths_model(family)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ds = paths.decompose(model, init="pretrained", sequences=3, tokens=6, batch_size=2)
    for k, v in model.state_dict().items():  # the user's model is never modified
        assert torch.equal(v, before[k])
    L = 3
    assert ds.sizes["layer"] == ds.sizes["path_length"] == L + 1
    last = ds.sel(init="pretrained", layer=L)
    # Shares of a layer sum to 1 (a ratio of float sums: rounding only).
    assert float(abs(last["share"].sum("path_length") - 1).max()) < 1e-12
    # Keeping every path reproduces the layer (rounding only) and the real run.
    assert float(last["truncation_error"].sel(path_length=L).max()) < 1e-12
    assert float(ds["reconstruction_error"].max()) < 1e-12
    assert float(ds["cosine"].sel(path_length=L).min()) == pytest.approx(1.0, abs=1e-12)
    eff = ds["effective_length"].sel(init="pretrained")
    assert bool(((eff >= 0) & (eff <= ds.layer)).all())
    # The uniform shares are the binomial counts: layer 2, H=2: 1/9, 4/9, 4/9.
    assert ds["uniform_share"].sel(layer=2).values[:3] == pytest.approx([1 / 9, 4 / 9, 4 / 9])
    if family == "gpt2":
        assert (
            float(abs(ds["loss"].sel(path_length=L) - ds["loss_full"]).max()) < 1e-5
        )  # float32 logits: a task measure
        assert ds.attrs["task"] == "loss"
    else:
        assert "loss" not in ds and ds.attrs["task"] == "cosine"
    html = render_paths(ds, result_file="x.nc")
    assert read_meta(html)["analysis"] == "paths-decompose"
    assert html.count("<svg") == 2 + ds.sizes["init"]  # shares per init; errors; lengths


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
