"""probe.attention on every family: sink_score, attention_entropy, top_key and Gu et al.'s
sink rate against HF's own ``output_attentions`` in float64 (tests/reference/attention_stats.py),
with padding; the pretrained MiniLM's sink rate as Gu et al. define it; the Dataset, its
provenance and its refusals.

The families come from ``probe.models.ADAPTERS`` and the tiny configs' branches, so a new
family is covered as soon as it has its entry and its tiny config.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probe
from probe.analyses.attention import measure_batch
from probe.errors import ProbeError
from probe.measures.attention_stats import Totals
from probe.surgery import masks
from tests.paths_tiny import (
    one_thread,  # noqa: F401  (autouse: one torch thread here)
    padded_inputs,
    path_model,
)
from tests.reference import own_masks
from tests.reference.attention import register as reference_attention
from tests.reference.attention_stats import statistics
from tests.reference.masked_attention import use as use_mask
from tests.test_paths_sample import NAMES, _hf_attentions

#: The run's masks: the model's own (per layer, sliding windows included) and four of probe's.
RUN_MASKS = ("model", "bidirectional", "causal", "window:1", "causal-window:2")


@pytest.mark.parametrize("text", RUN_MASKS)
@pytest.mark.parametrize("name", NAMES)
def test_statistics_equal_those_of_hf_output_attentions(name, text):
    """Every statistic under every mask the run can use, against loops over HF's own
    ``output_attentions`` with the mask applied by the references (their masked attention,
    and the keys each query saw written from the configs and the masks' definitions)."""
    model = path_model(name)
    probed = probe.wrap(model)
    run_mask = masks.parse_mask(text)
    try:
        masks.check(probed, run_mask)
    except ProbeError as err:  # a family probe cannot mask: one line, before any number
        assert "probe cannot mask it" in str(err) or "ALiBi" in str(err)
        return
    inputs, data, mask = padded_inputs(model)
    config, L, T = model.config, probed.n_layers, mask.shape[1]
    effective = masks.effective(probed, run_mask)
    if effective.is_model:
        attn = reference_attention() if probed.attn_implementation == "probe_eager" else None
        allowed = own_masks.allowed(config, L, T)
    else:
        attn = use_mask(effective.kind, effective.width, inputs.get("attention_mask"))
        allowed = own_masks.allowed(config, L, T, effective.kind, effective.width)
    hf = _hf_attentions(model, inputs, attn).numpy()  # (layer, sequence, head, query, key)
    learned = model.config.model_type == "gpt_oss"  # its attention's learned sink logits
    want = statistics(hf, mask.numpy(), allowed, epsilon=0.3, learned_sinks=learned)
    sums = Totals(probed.n_layers)
    with masks.applied([probed], run_mask):
        measure_batch(probed, data, mask, sums, 0, epsilon=0.3, run_mask=effective)
    got = {k: v.numpy() for k, v in sums.attention().items()}
    # Gu et al.'s Sink_eps: thresholds of per-sequence scores (none within 1e-12 of eps here);
    # the same count divided in another order: a few ulps.
    assert float(got["sink_frequency"].mean()) == pytest.approx(want["sink_rate"], abs=1e-15)
    np.testing.assert_array_equal(got["sink_frequency"], want["sink_frequency"])
    # The same float64 probabilities summed in another order (numpy loops against torch's
    # reductions) over <= 7 rows of <= 7 terms each: a few ulps of values <= 2 (entropy <= ln 7).
    for key in ("sink_score", "top_key_score"):
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-15, err_msg=key)
    np.testing.assert_allclose(
        got["attention_entropy"], want["attention_entropy"], rtol=0, atol=4e-15
    )
    # The mass outside the keys, 1 - sum_k A_ik, where the softmax has learned sink logits
    # (GPT-OSS), and nothing where it has none: the same sums, a few ulps of values <= 1.
    assert ("learned_sink_share" in got) == learned
    if learned:
        np.testing.assert_allclose(
            got["learned_sink_share"], want["learned_sink_share"], rtol=0, atol=2e-15
        )
        assert (want["learned_sink_share"] > 0.01).all()  # the sinks do take a share
    # Two backward-stable SVDs (LAPACK's through torch, numpy's) of the same float64 matrices
    # of <= 7 x 7: each singular value within a few T eps sigma_1, sigma_1 <= sqrt(7).
    for key in ("attention_gap", "attention_stable_rank"):
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-13, err_msg=key)
    # The top key is an argmax: equal where the reference's top is not within rounding of the
    # runner-up (no tie within 1e-12 in these random models).
    ordered = np.sort(want["received"], -1)
    assert (ordered[..., -1] - ordered[..., -2] > 1e-12).all()
    np.testing.assert_array_equal(got["top_key"], want["top_key"])


def test_dataset_of_a_run():
    model = path_model("llama")  # causal: a row that cannot see a key gives it 0
    ids = torch.randint(
        3, model.config.vocab_size, (3, 6), generator=torch.Generator().manual_seed(2)
    )
    ds = probe.attention(model, probe.Inputs(ids=ids, batch_size=2), epsilon=0.25)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    assert ds.attrs["analysis"] == "attention" and ds.attrs["epsilon"] == 0.25
    assert ds["sink_score"].dims == ("init", "layer", "head")
    assert ds["sink_score"].shape == (1, L + 1, H)
    assert np.isnan(ds["sink_score"][0, 0]).all() and np.isfinite(ds["sink_score"][0, 1:]).all()
    assert ds["massive_ratio"].dims == ("init", "layer") and np.isfinite(ds["massive_ratio"]).all()
    np.testing.assert_array_equal(ds["input_ids"].values, ids.numpy())
    share = float((ds["sink_score"][0, 1:] > 0.25).mean())
    assert float(ds["sink_head_share"][0]) == share
    assert float(ds["sink_rate"][0]) == float(ds["sink_frequency"][0, 1:].mean())
    # Two batches (2 + 1 sequences) add up to the one-batch run, to rounding.
    one = probe.attention(model, probe.Inputs(ids=ids, batch_size=3), epsilon=0.25)
    for name in ("sink_score", "attention_entropy", "attention_gap", "anisotropy"):
        np.testing.assert_allclose(ds[name], one[name], rtol=1e-13, atol=1e-15)
    # A causal model's first query row sees only the first token: the sink score is at least
    # 1/T (that row's whole attention, averaged over T rows).
    assert float(ds["sink_score"][0, 1:].min()) >= 1 / 6 - 1e-15
    # In a notebook: ds.probe.plot() is the layer x head heatmaps (two panels and their
    # colour bars per init), each image the (layer 1..L, head) values.
    fig = ds.probe.plot()
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2
    np.testing.assert_array_equal(images[0].get_array(), ds["sink_score"][0, 1:].values)


def test_fastformer_measures_the_hidden_states_only():
    model = path_model("fastformer")
    ids = torch.randint(
        0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0)
    )
    ds = probe.attention(model, probe.Inputs(ids=ids))
    assert np.isnan(ds["sink_score"]).all() and np.isnan(ds["sink_rate"]).all()
    assert np.isfinite(ds["massive_ratio"]).all() and np.isfinite(ds["anisotropy"]).all()
    assert "no T x T attention" in ds.attrs["attention_note"]


@pytest.mark.parametrize("epsilon", [0, 1, 2.0, -1])
def test_bad_epsilon_is_one_line_before_loading(epsilon):
    with pytest.raises(ProbeError, match="`epsilon`"):
        probe.attention("no/such-model", epsilon=epsilon)


def test_cli_writes_result_and_report_and_rerenders(tiny_bert_with_tokenizer, tmp_path):
    from typer.testing import CliRunner

    from probe.cli.app import app
    from probe.files.results import check_schema, open_result
    from probe.reports.render import render

    out = tmp_path / "out"
    args = ["attention", tiny_bert_with_tokenizer, "--init", "pretrained", "--sequences", "3",
            "--tokens", "8", "--epsilon", "0.2", "--out", str(out), "--quiet"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (nc,) = out.glob("attention-*.nc")
    assert nc.with_suffix(".html").is_file() and (out / "index.html").is_file()
    ds = open_result(nc)
    check_schema(ds, nc)
    assert ds.attrs["epsilon"] == 0.2 and "--epsilon 0.2" in ds.attrs["command"]
    html = render(ds, nc.name)
    assert "sink score and attention entropy per layer and head" in html
    assert "where the heads look most" in html
    # The top positions in the table, the rest folded: as many rows as positions in all.
    from probe.figures.plot_attention import sink_positions
    from probe.reports.attention_report import TOP_POSITIONS

    positions = sink_positions(ds, "pretrained")
    table = html.split("where the heads look most</h3>")[1].split("</table>")[0]
    assert table.count("<tr>") - 1 == min(len(positions), TOP_POSITIONS)
    if len(positions) > TOP_POSITIONS:
        assert f"the other {len(positions) - TOP_POSITIONS} positions" in html
    # The tokens that ran are named: every sequence's first token string is in the data.
    assert all(str(t) for t in ds["token_text"].sel(token=0).values)


@pytest.mark.parametrize("epsilon", ["0", "1", "1.5", "nan", "-0.1"])
def test_cli_refuses_epsilon_outside_the_open_interval(epsilon, tmp_path):
    from typer.testing import CliRunner

    from probe.cli.app import app

    result = CliRunner().invoke(app, ["attention", "minilm", "--epsilon", epsilon,
                                      "--out", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2
    assert "--epsilon" in result.output
    assert not (tmp_path / "o").exists()


def test_an_image_model_names_its_tokens_by_patch_index():
    model = path_model("vit")
    ds = probe.attention(model, probe.Inputs(sequences=3, batch_size=2))
    tokens = (model.config.image_size // model.config.patch_size) ** 2 + 1  # patches and [CLS]
    assert ds.sizes["token"] == tokens
    np.testing.assert_array_equal(ds["input_ids"].values, np.tile(np.arange(tokens), (3, 1)))
    assert np.isfinite(ds["sink_score"][0, 1:]).all()


def test_the_pretrained_minilms_sink_rate_is_gu_et_als():
    """Sink_eps on the real MiniLM checkpoint, against Gu et al.'s definition written from
    their code's description (tests/reference/attention_stats.py) on HF's own attentions:
    each sequence's first-token score thresholded, then averaged.  The share of heads whose
    mean score passes eps is another number on the same run."""
    from transformers import AutoModel

    from probe.loading import minilm_path

    ds = probe.attention("minilm", probe.Inputs(sequences=4, tokens=32), init="pretrained")
    ids = torch.from_numpy(ds["input_ids"].values)  # the shipped text, 4 x 32 real tokens
    model = AutoModel.from_pretrained(minilm_path(), attn_implementation="eager").double()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    hf = torch.stack(list(out.attentions)).numpy()
    want = statistics(hf, np.ones(ids.shape, dtype=bool), epsilon=0.3)  # every row sees every key
    # A count of thresholded scores over 4 x 6 x 12 triples, divided in two orders: a few ulps.
    got = float(ds["sink_rate"].sel(init="pretrained"))
    assert got == pytest.approx(want["sink_rate"], abs=1e-15)
    share = float((want["sink_score"] > 0.3).mean())
    assert float(ds["sink_head_share"].sel(init="pretrained")) == pytest.approx(share, abs=1e-15)


def test_a_result_of_learned_sinks_says_their_share_and_what_each_statistic_reads():
    """GPT-OSS's rows sum to less than one: the result holds the learned sink's share of each
    row beside the first token's, equal to 1 minus the rows' sums of HF's own probabilities,
    and says what the statistics read there; a family without learned sinks has neither."""
    model = path_model("gpt-oss")
    ids = torch.randint(
        3, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(4)
    )
    ds = probe.attention(model, probe.Inputs(ids=ids, batch_size=2))
    hf = _hf_attentions(model, {"input_ids": ids}, reference_attention()).numpy()
    want = (1 - hf.sum(-1)).mean(-1).mean(1)  # (layer, head): mean over rows, then sequences
    got = ds["learned_sink_share"].values[0, 1:]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)  # the same sums, a few ulps
    assert "learned sink logits" in ds.attrs["learned_sink_note"]
    assert "learned sink" in ds["learned_sink_share"].attrs["long_name"]
    plain = probe.attention(path_model("llama"), probe.Inputs(ids=ids, batch_size=2))
    assert "learned_sink_share" not in plain and "learned_sink_note" not in plain.attrs
