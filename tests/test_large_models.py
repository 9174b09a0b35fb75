"""Large models: low-precision dtypes, random init built in place, the bundled large configs."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import probe
from cli.app import app
from probe.analyses import collapse
from probe.loading import DTYPES, bundled_configs

# Parameter counts of the base models (no task heads) as published with the checkpoints,
# in millions; the configs are written from the published hyper-parameters.
PUBLISHED_MILLIONS = {
    "gpt2-medium": 355,
    "gpt2-large": 774,
    "gpt2-xl": 1558,
    "bert-large-uncased": 335,
    "albert-xxlarge-v2": 223,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MILLIONS))
def test_bundled_large_configs(name):
    from transformers import AutoConfig, AutoModel

    from probe.models import adapter_for

    assert name in bundled_configs()
    config = AutoConfig.for_model(**json.loads(bundled_configs()[name].read_text()))
    adapter_for(config.model_type).check(config)
    with torch.device("meta"):  # shapes only: no memory, no time
        model = AutoModel.from_config(config)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    assert millions == pytest.approx(PUBLISHED_MILLIONS[name], abs=0.6)  # published to 3 digits


def _drawn_once(build):
    """``build()`` with torch.nn.init's functions doing nothing: only the weights the model's
    own _init_weights draws (transformers keeps its own references to the real functions)."""
    import torch.nn.init as init

    saved = {n: getattr(init, n) for n in dir(init) if n.endswith("_") and not n.startswith("_")}
    try:
        for name in saved:
            setattr(init, name, lambda tensor, *args, **kwargs: tensor)
        return build()
    finally:
        for name, function in saved.items():
            setattr(init, name, function)


def test_random_init_on_cpu_is_the_seed_s_float32_weights_in_every_dtype(tiny_folders):
    from transformers import AutoConfig, AutoModel

    folder = tiny_folders["bert"]
    with torch.random.fork_rng(devices=[]):  # the model's own init, drawn once from the seed
        torch.manual_seed(3)
        once = _drawn_once(lambda: AutoModel.from_config(AutoConfig.from_pretrained(folder)))
        torch.manual_seed(3)
        plain = AutoModel.from_config(AutoConfig.from_pretrained(folder))
    expected = dict(once.named_parameters())
    # Guard: the layers' default init, drawn first, shifts the RNG stream; skipping it is
    # visible in the weights (so this test tells the single init from the double one).
    assert not torch.equal(plain.encoder.layer[0].attention.self.query.weight,
                           expected["encoder.layer.0.attention.self.query.weight"])  # fmt: skip
    for name, dtype in DTYPES.items():
        probed = probe.load(folder, init="random", seed=3, dtype=name)
        assert probed.dtype == dtype
        for key, value in probed.model.named_parameters():
            assert torch.equal(value, expected[key].detach().to(dtype)), (name, key)


def test_random_init_falls_back_where_the_model_s_init_misses_a_tensor(tiny_folders, monkeypatch):
    # A model whose _init_weights leaves tensors to the layers' default init: skipping that
    # default would leave them unset, so the model is built the plain way.
    from transformers import AutoConfig, AutoModel
    from transformers.models.bert import modeling_bert

    monkeypatch.setattr(modeling_bert.BertPreTrainedModel, "_init_weights", lambda self, m: None)
    folder = tiny_folders["bert"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        plain = dict(AutoModel.from_config(AutoConfig.from_pretrained(folder)).named_parameters())
    probed = probe.load(folder, init="random", seed=3)
    for key, value in probed.model.named_parameters():
        assert torch.equal(value, plain[key]), key


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_collapse_runs_in_low_precision_and_measures_in_float64(tiny_folders, dtype):
    probed = probe.load(tiny_folders["gpt2"], init="random", dtype=dtype)
    ds = collapse.run(probed, init="random", sequences=3, tokens=8, batch_size=2)
    assert ds.attrs["dtype"] == dtype
    for name in collapse.METRICS:
        assert ds[name].dtype == "float64" and bool(ds[name].notnull().all())
    # Same model in float32: low precision moves the metrics, but not far (bf16: 8 bits).
    ref = collapse.run(
        probe.load(tiny_folders["gpt2"], init="random"), init="random", sequences=3, tokens=8
    )
    cos = ds["cosine_similarity"].sel(variant="transformer")
    assert float(abs(cos - ref["cosine_similarity"].sel(variant="transformer")).max()) < 0.05


def test_cli_dtype_option(tiny_folders, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "collapse",
            tiny_folders["bert"],
            "--init",
            "random",
            "--dtype",
            "bfloat16",
            "--sequences",
            "2",
            "--tokens",
            "8",
            "--out",
            str(tmp_path),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (nc,) = tmp_path.glob("*.nc")
    assert probe.open_result(nc).attrs["dtype"] == "bfloat16"
