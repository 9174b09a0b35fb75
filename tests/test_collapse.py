"""The collapse analysis end to end on tiny local folders of every family."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import probe
from probe.analyses import collapse
from tests.reference import metrics_numpy
from tests.reference.surgery import reference_hidden_states
from tests.reference.tiny import FAMILIES

SMALL = {"sequences": 3, "tokens": 12}


@pytest.mark.parametrize("family", FAMILIES)
def test_metrics_equal_the_reference_pipeline(family, tiny_folders):
    """run() == numpy metrics of the module-surgery hidden states, for both inits and all variants."""
    ds = collapse.run(tiny_folders[family], init="both", dtype="float64", batch_size=2, **SMALL)
    ids = torch.randint(0, 80, (3, 12), generator=torch.Generator().manual_seed(0))
    for init in ("pretrained", "random"):
        model = probe.load(tiny_folders[family], init=init, dtype="float64").model
        for variant in probe.VARIANTS:
            ablation = probe.PRESETS[variant]
            states = reference_hidden_states(
                model, ids, attn_skip=ablation.attn_skip, mlp=ablation.mlp
            )
            for layer, x in enumerate(states):
                want = metrics_numpy.collapse_metrics(x.numpy())
                got = ds.sel(init=init, variant=variant, layer=layer)
                for name, value in want.items():
                    np.testing.assert_allclose(
                        got[name].values,
                        value,
                        rtol=1e-7,
                        atol=1e-10,
                        err_msg=f"{init} {variant} {layer} {name}",
                    )


def test_dataset_schema_and_provenance(tiny_folders):
    ds = collapse.run(
        tiny_folders["gpt2"], init="random", variants="SAN,transformer", seed=5, **SMALL
    )
    assert ds.relative_residual.dims == ("variant", "init", "layer", "sequence", "fit", "norm")
    assert ds.effective_rank.dims == ("variant", "init", "layer", "sequence")
    assert list(ds.variant.values) == ["SAN", "transformer"]
    assert list(ds.init.values) == ["random"]
    assert list(ds.layer.values) == [0, 1, 2]
    assert list(ds.fit.values) == ["mean", "svd"]
    assert list(ds.norm.values) == ["l1inf", "fro", "spectral", "l1", "linf"]
    attrs = ds.attrs
    assert attrs["analysis"] == "collapse" and attrs["family"] == "gpt2"
    assert attrs["model"] == tiny_folders["gpt2"]
    assert json.loads(attrs["config"])["model_type"] == "gpt2"
    assert attrs["inputs"] == "synthetic ids" and attrs["seed"] == 5
    assert attrs["sequences"] == 3 and attrs["tokens"] == 12 and attrs["dtype"] == "float32"
    assert "random init (seed 5)" in attrs["weights"]
    for key in (
        "probe_version",
        "torch_version",
        "transformers_version",
        "nnsight_version",
        "command",
        "created",
    ):
        assert attrs[key]
    assert {row["ablation"] for row in json.loads(attrs["ablation_table"])} == {"no skip", "no MLP"}
    assert not np.isnan(ds.relative_residual).any()


def test_same_command_same_numbers(tiny_folders):
    a = collapse.run(tiny_folders["albert"], init="random", seed=2, **SMALL)
    b = collapse.run(tiny_folders["albert"], init="random", seed=2, **SMALL)
    c = collapse.run(tiny_folders["albert"], init="random", seed=3, **SMALL)
    assert a.drop_attrs().identical(b.drop_attrs())
    assert not np.allclose(a.relative_residual, c.relative_residual)


def test_batching_does_not_change_the_numbers(tiny_folders):
    one = collapse.run(tiny_folders["xlnet"], init="random", batch_size=1, **SMALL)
    all_ = collapse.run(tiny_folders["xlnet"], init="random", batch_size=3, **SMALL)
    np.testing.assert_allclose(one.relative_residual, all_.relative_residual, rtol=1e-5, atol=1e-7)


def test_text_inputs_and_short_text(tiny_bert_with_tokenizer, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(
        "rank collapse is a property of pure attention networks. " * 12, encoding="utf-8"
    )
    said = []
    ds = collapse.run(
        tiny_bert_with_tokenizer,
        init="pretrained",
        text=path,
        sequences=50,
        tokens=16,
        warn=said.append,
    )
    assert ds.attrs["inputs"] == "tokenizer" and ds.attrs["text_source"] == str(path)
    assert ds.sizes["sequence"] == len(ds.sequence) < 50 and said


def test_pure_attention_collapses_on_the_pretrained_minilm():
    """The paper's finding on a real checkpoint: SAN -> ~0 within 6 layers, the transformer does not."""
    ds = collapse.run("minilm", init="pretrained", sequences=4, tokens=32)
    r = ds.relative_residual.sel(fit="mean", norm="l1inf", init="pretrained").mean("sequence")
    assert float(r.sel(variant="SAN", layer=6)) < 1e-4
    assert float(r.sel(variant="SAN+MLP", layer=6)) < 1e-3
    assert float(r.sel(variant="transformer", layer=6)) > 0.3


def test_loaded_model_and_init_mismatch(tiny_folders):
    probed = probe.load(tiny_folders["bert"], init="random")
    ds = collapse.run(probed, init="random", **SMALL)
    assert list(ds.init.values) == ["random"]
    with pytest.raises(probe.ProbeError, match="loaded with init 'random'"):
        collapse.run(probed, init="both", **SMALL)


def test_too_many_tokens_for_the_positions(tiny_folders):
    with pytest.raises(probe.ProbeError, match="at most 64 tokens"):
        collapse.run(tiny_folders["gpt2"], init="random", sequences=1, tokens=65)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_embeddings_are_measured_once_per_batch(family, tiny_folders, monkeypatch):
    # X_0 is the same under every ablation: its metrics are computed for the first variant
    # of a batch and reused, after an exact check, by the other three.
    calls = []
    real = collapse.metrics.collapse_metrics

    def counted(x, mask, *args):
        calls.append(x.shape)
        return real(x, mask, *args)

    together = collapse.run(tiny_folders[family], init="random", **SMALL)
    monkeypatch.setattr(collapse.metrics, "collapse_metrics", counted)
    collapse.run(tiny_folders[family], init="random", **SMALL)
    layers = together.sizes["layer"]
    batches = -(-SMALL["sequences"] // SMALL.get("batch_size", 16))
    assert len(calls) == batches * (4 * layers - 3)
    monkeypatch.undo()
    for variant in together.variant.values:  # alone, each variant measures X_0 itself
        alone = collapse.run(tiny_folders[family], init="random", variants=variant, **SMALL)
        np.testing.assert_array_equal(
            alone.relative_residual.sel(variant=variant),
            together.relative_residual.sel(variant=variant),
        )


def test_a_layer_is_refused_only_for_a_non_finite_value_in_a_real_token():
    from probe.analyses.collapse_measure import check_finite as _check_finite

    x = torch.ones(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    _check_finite(x, mask, 3)  # all finite
    x[0, 2, 1] = float("nan")  # padding may hold anything
    _check_finite(x, mask, 3)
    x[1, 0, 0] = float("inf")
    with pytest.raises(probe.ProbeError, match="layer 3's token representations hold NaN or inf"):
        _check_finite(x, mask, 3)
