"""The theory panel (probe/measures/theory.py, reports/theory.py): the paper's constants from a
model's weights, checked against hand computation and an independent numpy reference,
and the panel in every collapse report."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import probe
from probe.cli.app import app
from probe.linalg import lapack
from probe.measures import theory
from tests.reference import theory_numpy
from tests.reference.tiny import tiny_model, tiny_spec_model
from tests.test_families import TINY
from tests.test_families import _model as family_model

#: Float64 sums of the same few dozen numbers in another order: ~1e-15 relative apart.
RTOL = 1e-12


def test_norms_by_hand():
    a = torch.tensor([[1.0, -2.0, 0.0], [3.0, 0.5, -1.0]], dtype=torch.float64)
    assert theory.norm_1(a) == 4.0  # columns: 1+3, 2+0.5, 0+1
    assert theory.norm_inf(a) == 4.5  # rows: 1+2+0, 3+0.5+1
    assert theory.norm_1inf(a) == math.sqrt(18.0)


def test_activation_slopes_by_hand():
    # GELU' (x) = Phi(x) + x phi(x) is largest at x = sqrt(2): Phi(sqrt 2) + sqrt(2) phi(sqrt 2).
    phi = math.exp(-1.0) / math.sqrt(2 * math.pi)
    gelu = 0.5 * (1 + math.erf(1.0)) + math.sqrt(2) * phi
    # The grid step 1e-4 around a flat maximum: the grid's max is within 1e-8 of it.
    assert abs(theory.activation_lipschitz("gelu") - gelu) < 1e-8
    assert theory.activation_lipschitz("relu") == 1.0


def _hand_bert():
    """One layer, one head, hidden 2: weights chosen so every constant is a small hand sum."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=20,
        hidden_size=2,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=2,
        max_position_embeddings=16,
        hidden_act="gelu",
    )
    model = BertModel(config).double().eval()
    layer = model.encoder.layer[0]
    eye = torch.eye(2, dtype=torch.float64)
    with torch.no_grad():
        layer.attention.self.query.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
        layer.attention.self.key.weight.copy_(eye)
        layer.attention.self.value.weight.copy_(torch.tensor([[1.0, -1.0], [0.0, 2.0]]))
        layer.attention.output.dense.weight.copy_(eye)
        layer.intermediate.dense.weight.copy_(torch.tensor([[2.0, 0.0], [1.0, 1.0]]))
        layer.output.dense.weight.copy_(eye)
    return model


def test_constants_of_a_hand_made_model():
    found = theory.layer_constants(probe.wrap(_hand_bert()))
    # Row convention: A_q = W_q^T = [[1, 0], [2, 1]], A_k = I, W_QK = A_q A_k^T: columns
    # sum to 3 and 1, so ||W_QK||_1 = 3.
    assert found["qk"] == [3.0]
    # W_VO = W_v^T W_o^T = [[1, 0], [-1, 2]]: columns 2, 2; rows 1, 3 -> sqrt(2 * 3).
    assert found["vo"] == [pytest.approx(math.sqrt(6), rel=1e-15)]
    assert found["beta"] == [pytest.approx(3 * math.sqrt(6), rel=1e-15)]
    # c = 4 beta H / sqrt(d) with H = 1, d = 2: 12 sqrt(3).
    assert found["c"] == [pytest.approx(12 * math.sqrt(3), rel=1e-15)]
    # A_1 = W_i^T = [[2, 1], [0, 1]]: columns 2, 2; rows 3, 1 -> sqrt(6); A_2 = I -> 1.
    lip = theory.activation_lipschitz("gelu")
    assert found["lambda"] == [pytest.approx(lip * math.sqrt(6), rel=1e-15)]
    assert found["heads"] == 1 and found["d_qk"] == 2 and found["missing"] == []


@pytest.mark.parametrize(
    "family", ["bert", "gpt2", "llama", "mistral", "gpt-neox", "phi3", "olmo2", "bloom"]
)
def test_constants_equal_an_independent_reference(family):
    """Each weight layout the walker reads: linear, conv1d, GQA, neox-interleaved, fused."""
    model = tiny_model(family, seed=3) if family in ("bert", "gpt2") else tiny_spec_model(family)
    found = theory.layer_constants(probe.wrap(model))
    # BloomGelu is the tanh approximation of GELU (bloom_gelu_forward).
    act = {"gpt2": "gelu_new", "bloom": "gelu_pytorch_tanh"}.get(
        family, getattr(model.config, "hidden_act", "gelu")
    )
    lip = theory.activation_lipschitz(act)
    llama_like = family in ("mistral", "olmo2")
    want = theory_numpy.constants(model, "llama" if llama_like else family, lip)
    for key in ("qk", "vo", "beta", "c"):
        np.testing.assert_allclose(found[key], want[key], rtol=RTOL, atol=0, err_msg=key)
    if family in ("llama", "mistral", "phi3", "olmo2"):  # gated MLPs: no lambda, and why
        assert all(math.isnan(v) for v in found["lambda"])
        assert any("gated MLP" in line for line in found["missing"])
        assert any("rotary" in line for line in found["notes"])
    else:
        np.testing.assert_allclose(found["lambda"], want["lambda"], rtol=RTOL, atol=0)


@pytest.mark.parametrize("entries", [1, 7, 50, 10**6])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_constants_in_row_blocks_equal_the_reference(monkeypatch, family, entries):
    """Each head's product formed a block of rows at a time (one row; uneven blocks; one
    block), the same numbers as the whole product, to the rounding of the column sums."""
    monkeypatch.setattr(theory, "_BLOCK_ENTRIES", entries)
    model = tiny_model("gpt2", seed=3) if family == "gpt2" else tiny_spec_model("llama")
    found = theory.layer_constants(probe.wrap(model))
    act = "gelu_new" if family == "gpt2" else model.config.hidden_act
    want = theory_numpy.constants(model, family, theory.activation_lipschitz(act))
    for key in ("qk", "vo", "beta"):
        np.testing.assert_allclose(found[key], want[key], rtol=RTOL, atol=0, err_msg=key)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_products_side_by_side_give_the_numbers_of_one_thread(monkeypatch, family):
    """The heads' products in the serial threads, side by side, give the very numbers of one
    thread taking them one by one (each norm is the same serial code, whichever thread runs
    it): equal, not close.  Row blocks of a few entries make
    many passes through each thread's scratch buffer, where a shared one would show."""
    monkeypatch.setattr(theory, "_BLOCK_ENTRIES", 7)
    model = tiny_model(family, seed=5) if family != "llama" else tiny_spec_model("llama")
    probed = probe.wrap(model)
    pool = ThreadPoolExecutor(3, initializer=lapack._one_thread)  # whatever torch's count
    monkeypatch.setattr(theory, "_serial_pool", lambda device: pool)
    side_by_side = theory.layer_constants(probed)
    pool.shutdown()
    monkeypatch.setattr(theory, "_serial_pool", lambda device: None)
    one_by_one = theory.layer_constants(probed)
    assert len(side_by_side["qk"]) == probed.n_layers > 1
    for key in ("qk", "vo", "beta", "c", "lambda"):
        np.testing.assert_array_equal(side_by_side[key], one_by_one[key], err_msg=key)


def test_constants_asked_for_in_a_serial_thread_run_there(monkeypatch):
    """Called from the serial threads themselves, every one of them at once, the constants run
    in the asking thread: a wait there on the pool would wait for itself, forever."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # a pool of 2, on any machine
    probed = probe.wrap(tiny_model("gpt2", seed=5))
    want = theory.layer_constants(probed)
    pool = lapack.serial_threads()
    asked = [pool.submit(theory.layer_constants, probed) for _ in range(2)]
    for found in asked:
        assert found.result(timeout=60)["beta"] == want["beta"]


def test_a_layer_without_query_keys_says_so_after_the_layers_before_it(monkeypatch):
    """A layer whose queries and keys cannot be read ends the constants with one line; an
    error reading an earlier layer's values comes first."""
    from probe.errors import ProbeError
    from probe.models import weights

    probed = probe.wrap(tiny_model("gpt2", seed=5))
    layers = list(probed.model.h)
    read_qk, read_vo = weights.query_key, weights.value_output

    def query_key(layer, *args):
        if layer is layers[1]:
            raise ProbeError("no queries here")
        return read_qk(layer, *args)

    monkeypatch.setattr(weights, "query_key", query_key)
    found = theory.layer_constants(probed)
    assert found["missing"] == ["beta: no queries here"] and "beta" not in found

    def value_output(layer, *args):
        if layer is layers[0]:
            raise ProbeError("no values here")
        return read_vo(layer, *args)

    monkeypatch.setattr(weights, "value_output", value_output)
    with pytest.raises(ProbeError, match="no values here"):
        theory.layer_constants(probed)


def test_constants_inside_no_grad():
    """The activation's slope is measured with autograd, also inside a caller's no_grad."""
    theory.activation_lipschitz.cache_clear()
    with torch.no_grad():
        found = theory.layer_constants(probe.wrap(tiny_model("bert", seed=3)))
    assert found["lipschitz_activation"] == pytest.approx(1.1289, abs=1e-4)  # GELU's max slope


def test_the_constants_leave_torchs_lu_working():
    # torch.set_num_threads, which the constants once called twice a layer to run serially,
    # leaves MKL's batched LU in torch's CPU build returning impossible pivots for the rest of
    # the process (probe.linalg.lapack.serial_threads).  A fresh process, as a user's: 82 of 640
    # pivots were 0 after bert-tiny's constants.
    code = (
        "import torch, probe; from probe import theory; "
        "from tests.reference.tiny import tiny_model; "
        "theory.layer_constants(probe.wrap(tiny_model('bert', seed=3))); "
        "G = torch.randn(4, 160, 160, dtype=torch.float64, generator=torch.Generator().manual_seed(0)); "
        "pivots = torch.linalg.lu_factor(G)[1]; "
        "print(torch.get_num_threads(), int((pivots < 1).sum()))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}  # as a user has
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", "0"], done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("name", TINY)
def test_every_family_gives_constants_or_says_why(name):
    found = theory.layer_constants(probe.wrap(family_model(name)))
    if "beta" in found:
        L = len(found["beta"])
        assert L > 0 and all(np.isfinite(found["c"])) and len(found["lambda"]) == L
        assert all(np.isfinite(found["lambda"])) or any("gated" in m for m in found["missing"])
    else:  # one line naming the constant and the reason
        assert len(found["missing"]) == 1 and found["missing"][0].startswith("beta: ")


def test_the_recursion_is_the_theorem_closed_form_for_equal_constants():
    r0 = np.array([0.3, 2.0])
    c = [0.7, 0.7, 0.7]
    got = theory.recursion(r0, c)
    for L in range(4):  # Theorem 2.2: c^((3^L - 1)/2) r0^(3^L)
        np.testing.assert_allclose(got[L], c[0] ** ((3**L - 1) / 2) * r0 ** (3**L), rtol=1e-12)
    assert np.isinf(theory.recursion(np.array([1e10]), [1e10] * 5)[-1]).all()


def test_panel_measures_the_residual_of_each_variant():
    model = tiny_model("bert", seed=2)
    probed = probe.wrap(model)
    ids = torch.randint(3, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    found = theory.panel(probed, ids, mask)
    states = probe.hidden_states(probed, ids, probe.SAN)
    want = [
        np.median([theory_numpy.residual_1inf(x[s].double().numpy()) for s in range(3)])
        for x in states
    ]
    np.testing.assert_allclose(found["measured"]["SAN"], want, rtol=1e-12)
    bound = found["bounds"]["Theorem 2.2 (SAN)"]
    assert bound["bound"][0] == pytest.approx(want[0]) and bound["vacuous"][0] is None
    assert all(
        v == (b >= want[0]) for v, b in zip(bound["vacuous"][1:], bound["bound"][1:], strict=True)
    )


def test_every_collapse_report_has_the_panel(tmp_path):
    out = tmp_path / "out"
    for family in ("bert", "albert"):
        tiny_model(family).save_pretrained(tmp_path / family)
        args = ["collapse", str(tmp_path / family), "--sequences", "2", "--tokens", "6"]
        result = CliRunner().invoke(app, [*args, "--init", "pretrained", "--out", str(out)])
        assert result.exit_code == 0, result.output
    bert = next(out.glob("collapse-bert-*.html")).read_text()
    assert 'id="theory"' in bert and "Theorem 2.2 (SAN): bound" in bert and "measured/bound" in bert
    ds = xr.open_dataset(next(out.glob("collapse-bert-*.nc")))
    # beta has its (init, layer) dims; NaN at layer 0, the embeddings' output.
    assert ds["beta"].dims == ("init", "layer") and list(ds["init"].values) == ["pretrained"]
    assert int(ds["beta"].notnull().sum()) == 2 and np.isnan(ds["beta"].sel(layer=0)).all()
    albert = next(out.glob("collapse-albert-*.html")).read_text()
    assert 'id="theory"' in albert and "Theorem 2.2 has no constants here" in albert


def test_a_result_without_the_panel_still_renders():
    from probe.reports.figures import Figures
    from probe.reports.theory import theory_section

    html = theory_section(xr.Dataset(attrs={}), Figures())
    assert "run <code>probe collapse</code> again" in html


@pytest.mark.parametrize(
    ("batch", "stream", "surgery"),
    [(4, False, "probe"), (16, True, "probe"), (4, True, "paper")],
    ids=["in-memory", "streamed", "paper-surgery"],
)
def test_a_collapse_run_takes_the_panel_from_its_own_forwards(tmp_path, batch, stream, surgery):
    # The panel's SAN, SAN+MLP and SAN+skip residuals come from the run's first batch, not
    # from three more traces; they must be the numbers those traces give.  With the first
    # batch no larger than the panel's 8 sequences the forwards are the same ones: exact.
    # A batch of 16 runs the 8 sequences inside a larger matmul: float32 rounding of the
    # forward (relative 1e-6 over two layers of width 32), the norms themselves in float64.
    # Under --surgery paper the run's variants are not the panel's: the panel traces its own.
    from probe.analyses import collapse
    from probe.surgery.ablate import PRESETS
    from probe.surgery.trace import layer_values

    probed = probe.wrap(tiny_model("bert", seed=3))
    options = dict(init=probed.init, sequences=20, tokens=7, batch_size=batch, seed=1,
                   surgery=surgery)  # fmt: skip
    if stream:
        collapse.run(probed, stream_to=tmp_path / "run.nc", **options)
        ds = xr.open_dataset(tmp_path / "run.nc")
    else:
        ds = collapse.run(probed, **options)
    measured = ds["panel_residual"].isel(init=0)
    plan = collapse.prepare(probed, **options)
    ids, mask = plan.inputs.input_ids[:8], plan.inputs.attention_mask[:8]
    for name in theory.PANEL_VARIANTS:
        per_layer = layer_values(probed, ids[: min(batch, 8)], PRESETS[name],
                                 theory.residual_norm, mask[: min(batch, 8)])  # fmt: skip
        want = np.median(np.stack(per_layer), axis=1)
        if batch <= 8:
            assert measured.sel(panel_variant=name).values.tolist() == want.tolist()
        else:
            np.testing.assert_allclose(measured.sel(panel_variant=name), want, rtol=1e-6)
    ds.close()


def test_the_residual_norms_of_padded_sequences_ignore_the_padding():
    # Hand-made: sequence 0 has two real tokens; its padding holds huge values, which must
    # not count.  res = rows (-1, 0) and (1, 0): ||.||_1 = 2, ||.||_inf = 1 -> sqrt(2).
    x = torch.tensor([[[0.0, 5.0], [2.0, 5.0], [1e6, -1e6]], [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = theory.residual_norms(x, mask)
    want1 = theory_numpy.residual_1inf(x[1].double().numpy())
    # sqrt(2 * 1): torch's float64 sqrt is within one unit in the last place (measured one
    # unit below math.sqrt's correctly rounded value under AVX-512).
    assert got[0].item() == pytest.approx(math.sqrt(2.0), rel=2.0**-52)
    assert got[1].item() == pytest.approx(want1, rel=1e-15)


# --- the panel as result variables (probe.measures.bounds) ------------------------------------


def _assert_variables_are_the_panels(ds: xr.Dataset, panels: list[dict]) -> None:
    """Every number of theory.panel, per init, is where probe.measures.bounds puts it, bit for bit."""
    from probe.measures import bounds

    assert list(ds["init"].values) == [found["init"] for found in panels]
    for found in panels:
        one = ds.sel(init=found["init"])
        keys = {"qk_norm": "qk", "vo_norm": "vo", "beta": "beta", "contraction": "c",
                "lambda_mlp": "lambda"}  # fmt: skip
        for name, key in keys.items():
            assert one[name].dims == ("layer",) and np.isnan(one[name].values[0])
            np.testing.assert_array_equal(one[name].values[1:], found[key], strict=True)
        assert float(one["heads"]) == found["heads"] and float(one["d_qk"]) == found["d_qk"]
        np.testing.assert_array_equal(one["activation_lipschitz"], found["lipschitz_activation"])
        for variant, values in found["measured"].items():
            assert one["panel_residual"].sel(panel_variant=variant).values.tolist() == values
        labelled = {}
        for variant, theorem in zip(bounds.PANEL_VARIANTS, bounds.THEOREMS, strict=True):
            labelled[f"{theorem} ({variant})"] = one.sel(panel_variant=variant)
        for name, bound in found["bounds"].items():
            got = labelled.pop(name)
            assert bound["variant"] == str(got["panel_variant"].values)
            assert got["bound"].values.tolist() == bound["bound"]
            assert got["bound_ratio"].values.tolist() == bound["ratio"]
            assert got["bound_vacuous"].values.tolist() == [False, *bound["vacuous"][1:]]
        for got in labelled.values():  # no theorem bounds these (SAN+skip; a gated SAN+MLP)
            assert got["bound"].isnull().all() and got["bound_ratio"].isnull().all()
            assert not got["bound_vacuous"].any()
    assert "theory" not in ds.attrs  # no numbers kept as JSON
    notes = {line for found in panels for line in found.get("notes", [])}
    missing = {line for found in panels for line in found.get("missing", [])}
    assert set(bounds.lines(ds, bounds.NOTES)) == notes
    assert set(bounds.lines(ds, bounds.MISSING)) == missing


@pytest.mark.parametrize("stream", [False, True], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("family", ["bert", "llama"])  # llama: gated, no SAN+MLP bound
def test_a_runs_theory_variables_are_what_the_panel_computes(tmp_path, family, stream):
    from probe.analyses import collapse

    folder = tmp_path / family
    (tiny_model if family == "bert" else tiny_spec_model)(family, seed=4).save_pretrained(folder)
    # A first batch within the panel's 8 sequences: its forwards are the panel's own (exact).
    options = dict(init="both", sequences=10, tokens=7, batch_size=4, seed=1, dtype="float64")
    if stream:
        collapse.run(str(folder), stream_to=tmp_path / "run.nc", **options)
        ds = xr.open_dataset(tmp_path / "run.nc")
    else:
        ds = collapse.run(str(folder), **options)
    plan = collapse.prepare(str(folder), **options)
    ids, mask = plan.inputs.input_ids[:4], plan.inputs.attention_mask[:4]
    panels = [theory.panel(probed, ids, mask) for probed in plan.models]
    assert [found["init"] for found in panels] == ["pretrained", "random"]
    assert ("Corollary 3.2 (SAN+MLP)" in panels[0]["bounds"]) == (family == "bert")
    _assert_variables_are_the_panels(ds, panels)
    for name in ("bound", "panel_residual", "beta", "lambda_mlp", "heads"):
        assert ds[name].attrs["long_name"] and ds[name].attrs["units"] == "1"
    ds.close()


def test_an_old_results_theory_attribute_is_read_as_the_variables(tmp_path):
    # Results written before the variables kept the panel as JSON in attrs["theory"]: the
    # report of such a file converts it (probe.measures.bounds.from_attribute) and draws the same.
    from probe.analyses import collapse
    from probe.measures import bounds
    from probe.reports.figures import Figures
    from probe.reports.theory import theory_section

    probed = probe.wrap(tiny_spec_model("gemma2", seed=2))
    options = dict(init=probed.init, sequences=6, tokens=7, batch_size=3, seed=1)
    new = collapse.run(probed, **options)
    plan = collapse.prepare(probed, **options)
    panels = [theory.panel(probed, plan.inputs.input_ids[:3], plan.inputs.attention_mask[:3])]
    assert panels[0]["notes"]  # gemma2's scale and rotary embeddings: caveats to carry over
    old = new.drop_vars([*bounds.VARIABLES, "panel_variant", "theorem"])
    old.attrs = {k: v for k, v in new.attrs.items() if k not in (bounds.MISSING, bounds.NOTES)}
    old.attrs["theory"] = json.dumps(panels)
    old.to_netcdf(tmp_path / "old.nc", engine="h5netcdf")
    with xr.open_dataset(tmp_path / "old.nc", engine="h5netcdf") as saved:
        converted = bounds.from_attribute(saved)
        _assert_variables_are_the_panels(converted, panels)
        xr.testing.assert_identical(converted[list(bounds.VARIABLES)], new[list(bounds.VARIABLES)])
        html = theory_section(saved, Figures())
    assert html == theory_section(new, Figures())
    assert "Theorem 2.2 (SAN): bound" in html and "measured/bound" in html
    assert bounds.from_attribute(new) is new  # a current result is left as it is
