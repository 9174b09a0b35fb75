"""The collapse analysis end to end on tiny local folders of every family."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import probe
from probe.analyses import collapse
from probe.reports.reproduce import command_line
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
        "request",  # a library call's request, as data ...
        "created",
    ):
        assert attrs[key]
    assert command_line(attrs).startswith("probe collapse ")  # ... and the command it renders
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


@pytest.mark.parametrize("method", ["exact", "estimate"])
def test_layers_measured_together_equal_one_call_a_layer(method, monkeypatch):
    # The CUDA loop measures a batch's layers in few calls (collapse_measure.measure_layers);
    # every metric is per sequence, so each layer's numbers are those of its own call.  Here
    # on the CPU, with calls small enough that the layers split over several of them.
    from probe.analyses import collapse_measure
    from probe.measures.metrics import METRICS, collapse_metrics

    generator = torch.Generator().manual_seed(7)
    layers = []
    for scale in (1.0, 1e-3, 1e3, 1.0, 1.0):  # a few layers of a batch of 3 sequences
        x = scale * torch.randn(3, 40, 24, generator=generator)
        x[1] = x[1, :1] + 1e-6 * x[1]  # one sequence nearly collapsed
        mask = torch.ones(3, 40, dtype=torch.bool)
        mask[2, 33:] = False
        layers.append((x, mask))
    layers.append((torch.randn(2, 17, 24, generator=generator), torch.ones(2, 17, dtype=bool)))
    per_sequence = 8 * (40 * 24 + 24 * 24 + 8 * 128 * 24)
    monkeypatch.setattr(collapse_measure, "MEASURE_BYTES", 7 * per_sequence)  # 2 layers a call
    calls = []
    real_call = collapse_measure.metrics.collapse_metrics
    monkeypatch.setattr(
        collapse_measure.metrics,
        "collapse_metrics",
        lambda X, *a: calls.append(len(X)) or real_call(X, *a),
    )
    together = collapse_measure.measure_layers(layers, METRICS, method)
    assert calls == [6, 6, 3, 2]  # 5 layers of 3 in calls of at most 7, then the other shape
    for (x, mask), got in zip(layers, together, strict=True):
        alone = collapse_metrics(x, mask, METRICS, method)
        assert got.keys() == alone.keys()
        for name in alone:
            torch.testing.assert_close(got[name], alone[name], rtol=0, atol=0)  # bit for bit


def test_the_cuda_loops_logic_gives_the_cpu_loops_numbers(tiny_folders, monkeypatch):
    # The CUDA loop (layers copied in the trace, measured a batch later by a worker thread,
    # all layers of a batch together, the theory panel from the first batch) run here on
    # the CPU, with streams, events and pinned memory replaced by stand-ins: it must give
    # the plain CPU loop's result bit for bit.  benchmarks/gpu.sh runs the real one on a GPU.
    import contextlib
    import types

    import xarray as xr

    from probe.analyses import collapse, collapse_measure

    probed = probe.load(tiny_folders["gpt2"], dtype="float64")
    options = {
        "init": "pretrained",
        "sequences": 5,
        "tokens": 16,
        "batch_size": 2,
        "metrics": "all",
    }
    plain = collapse.run(probed, **options)

    class Stand:
        def __init__(self, *args):
            pass

        def record(self, *args):
            pass

        wait_event = synchronize = record

    fake_cuda = types.SimpleNamespace(
        Event=Stand,
        Stream=Stand,
        current_stream=Stand,
        stream=lambda s: contextlib.nullcontext(),
    )
    monkeypatch.setattr(collapse_measure, "pipelined", lambda plan: True)
    monkeypatch.setattr(collapse_measure, "_to_host", lambda value: value.clone())
    monkeypatch.setattr(collapse_measure.torch, "cuda", fake_cuda)
    calls = []
    real = collapse_measure.measure_layers
    monkeypatch.setattr(
        collapse_measure,
        "measure_layers",
        lambda layers, *a: calls.append(len(layers)) or real(layers, *a),
    )
    piped = collapse.run(probed, **options)
    monkeypatch.undo()
    L = probed.n_layers + 1
    assert calls == [4 * L] * 3  # three batches, each one call for its 4 variants' layers
    for name in plain.data_vars:
        if plain[name].dtype.kind == "f":
            # The same float64 arithmetic on calls of other batch sizes: MKL picks its
            # kernels by shape, so inputs differ in the last bit, which the eigensolvers
            # carry to ~1e-14 (seen: 3e-16 in residuals, 1.6e-14 in an effective rank).
            np.testing.assert_allclose(piped[name], plain[name], rtol=1e-12, atol=0, err_msg=name)
        else:
            xr.testing.assert_identical(piped[name], plain[name])
    assert piped.attrs == plain.attrs | {"created": piped.attrs["created"]}


def test_a_result_holds_the_token_ids_that_ran(tmp_path):
    """input_ids (sequence, token), as given, in memory and streamed to a file alike; the
    shipped text's chunks of a model with a tokenizer are the ids the tokenizer made."""
    from tests.reference.tiny import tiny_model

    ids = torch.randint(3, 80, (3, 5), generator=torch.Generator().manual_seed(4))
    inputs = probe.Inputs(ids=ids, batch_size=2)
    kept = collapse.run(tiny_model("gpt2"), inputs, variants="SAN")
    np.testing.assert_array_equal(kept["input_ids"].values, ids.numpy())
    assert kept["input_ids"].dims == ("sequence", "token")
    streamed = collapse.run(
        tiny_model("gpt2"), inputs, variants="SAN", stream_to=tmp_path / "run.nc"
    )
    np.testing.assert_array_equal(streamed["input_ids"].values, ids.numpy())
    text = collapse.run("minilm", probe.Inputs(sequences=2, tokens=8), variants="SAN")
    from transformers import AutoTokenizer

    from probe.loading import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    assert tokenizer.convert_ids_to_tokens(text["input_ids"].values[0].tolist())
    assert (text["input_ids"].values >= 0).all()  # chunks of exactly 8 real tokens
