"""Models with nothing to measure are refused in one line, never published as NaN.

* A module built on the meta device has shapes and no values: every entry that takes a
  module (``probe.wrap``, ``probe.load``, collapse, attention, both path analyses) refuses
  it where they all pass, ``probe.loading.wrap``; a model dispatched by accelerate keeps its
  offloaded weights on the meta device too, under its hooks, and is accepted.
* A model whose representations are finite but all zero (every weight zero) makes every
  ratio 0/0: each analysis stops at the first such layer (``probe.measures.overflow.check_nonzero``)
  with one line naming the model, init, variant and layer, exit 2 through the CLI, and
  writes nothing.  A single zero token among others is measurable (its cosines count as 0).
"""

from __future__ import annotations

import re

import pytest
import torch
import transformers
import xarray as xr

import probe
from probe.analyses import attention, collapse, path_decompose, path_sample
from probe.errors import ProbeError
from probe.measures import metrics
from probe.measures.overflow import check_nonzero
from tests.reference.tiny import tiny_config, tiny_model
from tests.test_nonfinite import refused

SMALL = {"sequences": 2, "tokens": 8, "command": "c"}
SMALL_ARGS = ["--sequences", "2", "--tokens", "8"]
DEGENERATE = (
    "the model's weights are degenerate; use other weights (trained ones, or at random init "
    "a larger initializer_range through --set)"
)


def _saved(folder, model) -> str:
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def zero_folder(tmp_path_factory) -> str:
    """A tiny GPT-2 with every parameter zero, saved (no tokenizer)."""
    model = tiny_model("gpt2", seed=1, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    return _saved(tmp_path_factory.mktemp("zero") / "zero-gpt2", model)


@pytest.fixture(scope="module")
def meta_model():
    with torch.device("meta"):
        return transformers.GPT2Model(tiny_config("gpt2"))


# --- a model on the meta device -------------------------------------------------------

META = re.compile(
    r"GPT2Model was built without its weights: wte\.weight and \d+ more tensors are on the "
    r"meta device; load it with them \(from_pretrained, or load_state_dict with "
    r"assign=True\), or pass its name or folder instead"
)


@pytest.mark.parametrize(
    "entry",
    [
        probe.wrap,
        probe.loading.wrap,
        probe.load,
        lambda m: collapse.prepare(m, **SMALL),
        lambda m: collapse.run(m, **SMALL),
        lambda m: attention.run(m, **SMALL),
        lambda m: path_sample.sample(m, samples=2, **SMALL),
        lambda m: path_decompose.decompose(m, **SMALL),
    ],
    ids=["wrap", "loading.wrap", "load", "prepare", "collapse", "attention", "sample", "decompose"],
)
def test_every_entry_refuses_a_model_without_weights(meta_model, entry):
    with pytest.raises(ProbeError) as caught:
        entry(meta_model)
    assert META.fullmatch(str(caught.value)), str(caught.value)


def test_a_model_with_one_tensor_left_on_the_meta_device_is_refused_too():
    model = tiny_model("gpt2", seed=1, dtype=torch.float32)
    model.register_buffer("empty", torch.empty(3, device="meta"))
    with pytest.raises(ProbeError, match=r"^GPT2Model was built without its weights: empty is on"):
        probe.wrap(model)


def test_a_model_dispatched_with_offloaded_weights_is_wrapped_as_the_whole(tmp_path):
    folder = _saved(tmp_path / "tiny-gpt2", tiny_model("gpt2", seed=1, dtype=torch.float32))
    whole = probe.load(folder, init="random")
    size = sum(p.numel() * p.element_size() for p in whole.model.parameters())
    spread = probe.load(
        folder,
        init="random",
        device_map="auto",
        max_memory={"cpu": int(0.6 * size)},
        offload_folder=tmp_path / "offload",
    )
    assert any(p.device.type == "meta" for p in spread.model.parameters())
    wrapped = probe.wrap(spread.model)  # its raw module: meta tensors under accelerate's hooks
    assert wrapped.device_map
    options = {**SMALL, "init": "pretrained"}
    a = collapse.run(probe.wrap(whole.model), **options)
    b = collapse.run(wrapped, **options)
    for name in ("relative_residual", "effective_rank", "cosine_similarity"):
        xr.testing.assert_identical(a[name], b[name])


# --- representations with nothing to measure ------------------------------------------


def test_the_check_refuses_a_zero_sequence_at_its_real_tokens_only():
    x = torch.randn(2, 4, 8)
    real = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    x[0, 3] = 0  # padding may be zero
    x[1, 2] = 0  # one zero token among others is measurable
    x[0, 0, 0] = float("nan")  # not zero (the overflow check's business)
    check_nonzero(x, real, 1)
    x[0, :3] = 0
    x[0, 3] = 5.0  # padding does not count
    with pytest.raises(ProbeError) as caught:
        check_nonzero(x, real, 3, "m (pretrained, SAN)")
    assert str(caught.value) == (
        "m (pretrained, SAN): layer 3's token representations are all zero in a whole "
        "sequence, so every ratio measured on it is 0/0: the model's weights are degenerate; "
        "use other weights (trained ones, or at random init a larger initializer_range "
        "through `config`)"
    )


def test_a_single_zero_token_keeps_every_collapse_metric_finite():
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    x[:, 2] = 0
    values = metrics.collapse_metrics(x)
    for name, value in values.items():
        assert bool(torch.isfinite(value).all()), name
    assert values["cosine_similarity"][0] == metrics.cosine_similarity(x)[0]


@pytest.mark.parametrize(
    ("run", "line"),
    [
        (
            lambda m: collapse.run(m, init="pretrained", **SMALL),
            "{m} (pretrained, SAN): layer 0's token representations are all zero in a whole "
            "sequence, so every ratio measured on it is 0/0",
        ),
        (
            lambda m: attention.run(m, init="pretrained", **SMALL),
            "{m} (pretrained): layer 0's token representations are all zero in a whole "
            "sequence, so nothing is there to measure and the next layer's attention sees no "
            "token",
        ),
        (
            lambda m: path_sample.sample(m, init="pretrained", samples=2, **SMALL),
            "{m} (pretrained): layer 0's token representations are all zero in a whole "
            "sequence, so the next layer's attention sees no token (its probabilities are set "
            "by the positions alone)",
        ),
        (
            lambda m: path_decompose.decompose(m, init="pretrained", **SMALL),
            "{m} (pretrained, SAN+skip): layer 0's token representations are all zero in a "
            "whole sequence, so every share and error of its paths is 0/0",
        ),
    ],
    ids=["collapse", "attention", "sample", "decompose"],
)
def test_every_analysis_refuses_a_zero_model_at_its_first_layer(zero_folder, run, line):
    with pytest.raises(ProbeError) as caught:
        run(zero_folder)
    assert str(caught.value).startswith(line.format(m=zero_folder) + ": the model's weights")


@pytest.mark.parametrize(
    ("analysis", "where"),
    [
        (["collapse"], "(pretrained, SAN)"),
        (["attention"], "(pretrained)"),
        (["paths", "--sample", "--samples", "4"], "(pretrained)"),
        (["paths", "--decompose"], "(pretrained, SAN+skip)"),
    ],
    ids=["collapse", "attention", "sample", "decompose"],
)
def test_cli_zero_model_is_one_line_exit_2_nothing_written(zero_folder, tmp_path, analysis, where):
    command, *rest = analysis
    line = refused(tmp_path, command, zero_folder, *rest, "--init", "pretrained", *SMALL_ARGS)
    assert line.startswith(f"{zero_folder} {where}: layer 0's token representations are all zero")
    assert line.endswith(DEGENERATE)


def test_cli_random_init_of_zero_weights_names_the_layer_they_vanish_at(tmp_path):
    line = refused(
        tmp_path, "collapse", "gpt2-tiny", "--init", "random", "--set", "initializer_range=0",
        *SMALL_ARGS,
    )  # fmt: skip
    assert line.startswith("gpt2-tiny (random, SAN): layer 1's token representations are all")
    assert line.endswith(DEGENERATE)


def test_attention_refuses_a_layer_whose_median_entry_is_zero():
    # Half the hidden dims and more zero in every embedding: X_0's median |entry| is 0, while
    # no token is all zero, so massive_ratio would divide by 0.
    model = tiny_model("gpt2", seed=1, dtype=torch.float32)
    half = model.config.n_embd // 2 + 1
    with torch.no_grad():
        model.wte.weight[:, :half] = 0
        model.wpe.weight[:, :half] = 0
    with pytest.raises(ProbeError) as caught:
        attention.run(model, init="pretrained", **SMALL)
    assert str(caught.value).startswith(
        "GPT2Model (pretrained): layer 0's token representations are zero in half their "
        "entries or more in every sequence, so massive_ratio divides by a median of 0: the "
        "model's weights are degenerate"
    )


def test_attention_of_one_sequence_says_why_anisotropy_is_nan():
    ds = attention.run("gpt2-tiny", init="pretrained", sequences=1, tokens=8, command="c")
    assert bool(ds["anisotropy"].isnull().all())
    assert ds["anisotropy"].attrs["note"].startswith("NaN: one sequence has no pair of tokens")
    many = attention.run("gpt2-tiny", init="pretrained", **SMALL)
    assert "note" not in many["anisotropy"].attrs
    assert bool(many["anisotropy"].notnull().all())


def test_decomposition_refuses_a_layer_whose_paths_all_vanish():
    # BERT is post-LN: a zero LayerNorm scale after layer 0's attention leaves X_1 = beta in
    # every token, not zero, while every path through it carries 0: its shares are 0/0.
    model = tiny_model("bert", seed=1, dtype=torch.float64)
    with torch.no_grad():
        model.encoder.layer[0].attention.output.LayerNorm.weight.zero_()
    with pytest.raises(ProbeError) as caught:
        path_decompose.decompose(model, init="pretrained", **SMALL)
    assert str(caught.value).startswith(
        "BertModel (pretrained, SAN+skip): the share of layer 1 is 0/0 (its paths, or what "
        "they sum to, are all zero in a sequence): the model's weights are degenerate"
    )
