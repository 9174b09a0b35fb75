"""Loading: local folders, random init from bundled configs, the embedded MiniLM, clear errors."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

import probe
from probe.loading import bundled_configs, minilm_path
from tests.reference.tiny import FAMILIES, tiny_model


@pytest.mark.parametrize("family", FAMILIES)
def test_local_folder_pretrained_loads_the_saved_weights(family, tiny_folders):
    probed = probe.load(tiny_folders[family])
    assert probed.family == family and probed.init == "pretrained"
    assert probed.model.config._attn_implementation == "eager"
    saved = tiny_model(family, seed=1, dtype=torch.float32).state_dict()
    loaded = probed.model.state_dict()
    assert set(saved) == set(loaded)
    assert all(torch.equal(saved[key], loaded[key]) for key in saved)
    assert "local folder" in probed.weights


@pytest.mark.parametrize("family", FAMILIES)
def test_random_init_is_fixed_by_the_seed(family, tiny_folders):
    a = probe.load(tiny_folders[family], init="random", seed=7)
    b = probe.load(tiny_folders[family], init="random", seed=7)
    c = probe.load(tiny_folders[family], init="random", seed=8)
    pretrained = probe.load(tiny_folders[family])
    pa, pb, pc, pp = (list(m.model.parameters()) for m in (a, b, c, pretrained))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert any(not torch.equal(x, y) for x, y in zip(pa, pc, strict=True))
    assert any(not torch.equal(x, y) for x, y in zip(pa, pp, strict=True))


def test_random_init_leaves_the_global_rng_alone(tiny_folders):
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    probe.load(tiny_folders["bert"], init="random")
    assert torch.equal(torch.rand(3), want)


def test_family_comes_from_the_config_not_the_name(tiny_folders, tmp_path):
    folder = tmp_path / "gpt2-but-really-bert"
    shutil.copytree(tiny_folders["bert"], folder)
    assert probe.load(folder).family == "bert"


def test_bundled_configs_cover_the_canonical_ids():
    from transformers import AutoConfig

    base = {
        "bert-base-uncased",
        "bert-base-cased",
        "albert-base-v2",
        "xlnet-base-cased",
        "gpt2",
    }
    assert base <= set(bundled_configs())  # the large ones: tests/test_large_models.py
    for name in base:
        config = AutoConfig.for_model(**json.loads(bundled_configs()[name].read_text()))
        assert config.num_hidden_layers == 12 and config.hidden_size == 768, name


def test_random_init_of_a_hub_id_works_offline():
    probed = probe.load("gpt2", init="random")
    assert probed.family == "gpt2" and probed.n_layers == 12 and probed.tokenizer is None
    assert "random init (seed 0)" in probed.weights


def test_pretrained_hub_id_offline_is_one_clear_error():
    with pytest.raises(probe.ProbeError) as info:
        probe.load("bert-base-uncased")
    message = str(info.value)
    assert "\n" not in message
    assert "`init` random" in message and "local save_pretrained folder" in message


def test_minilm_alias_is_the_embedded_checkpoint():
    probed = probe.load("minilm")
    assert probed.family == "bert" and probed.n_layers == 6
    assert probed.config.hidden_size == 384 and probed.config.num_attention_heads == 12
    assert probed.tokenizer is not None
    assert str(minilm_path()) in probed.weights
    long_name = probe.load("sentence-transformers/all-MiniLM-L6-v2")
    first = next(long_name.model.parameters())
    assert torch.equal(first, next(probed.model.parameters()))


def test_unsupported_family_lists_the_supported_ones_and_probe_check(tmp_path):
    from transformers import MptConfig  # BLOOM, the example before, is now supported

    MptConfig(n_layers=1, d_model=16, n_heads=2).save_pretrained(tmp_path)
    with pytest.raises(
        probe.ProbeError,
        match=r"unsupported model family 'mpt'; supported: bert, roberta, .*llama.*probe check",
    ):
        probe.load(tmp_path, init="random")


def test_a_refused_family_says_why(tmp_path):
    from transformers import MambaConfig

    MambaConfig(num_hidden_layers=1, hidden_size=16).save_pretrained(tmp_path)
    with pytest.raises(probe.ProbeError, match="'mamba' is refused: not an attention model"):
        probe.load(tmp_path, init="random")


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda p: None, "without config.json"),
        (lambda p: (p / "config.json").write_text("{not json"), "cannot read"),
    ],
)
def test_broken_folders(tmp_path, setup, match):
    setup(tmp_path)
    with pytest.raises(probe.ProbeError, match=match):
        probe.load(tmp_path)


def test_folder_without_weights(tiny_folders, tmp_path):
    shutil.copy(f"{tiny_folders['bert']}/config.json", tmp_path / "config.json")
    with pytest.raises(probe.ProbeError, match="cannot load pretrained weights from folder"):
        probe.load(tmp_path)
    assert probe.load(tmp_path, init="random").family == "bert"  # the config alone is enough


def test_corrupt_weights(tiny_folders, tmp_path):
    shutil.copy(f"{tiny_folders['bert']}/config.json", tmp_path / "config.json")
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(probe.ProbeError, match="cannot load pretrained weights"):
        probe.load(tmp_path)


def test_missing_path_and_bad_options(tiny_folders):
    with pytest.raises(probe.ProbeError, match="no such model folder"):
        probe.load("./does/not/exist")
    with pytest.raises(probe.ProbeError, match="unknown init"):
        probe.load(tiny_folders["bert"], init="trained")
    with pytest.raises(probe.ProbeError, match="unknown dtype"):
        probe.load(tiny_folders["bert"], dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(probe.ProbeError, match="no CUDA device"):
            probe.load(tiny_folders["bert"], device="cuda")


def test_dtype_float64(tiny_folders):
    assert probe.load(tiny_folders["xlnet"], dtype="float64").dtype == torch.float64


def test_folder_without_tokenizer_files_has_no_tokenizer(tiny_folders, tiny_bert_with_tokenizer):
    assert probe.load(tiny_folders["bert"]).tokenizer is None
    assert probe.load(tiny_bert_with_tokenizer).tokenizer is not None


def test_albert_with_several_layer_groups_is_refused(tmp_path):
    from transformers import AlbertConfig

    AlbertConfig(
        num_hidden_layers=4,
        num_hidden_groups=2,
        hidden_size=16,
        num_attention_heads=2,
        embedding_size=8,
    ).save_pretrained(tmp_path)
    with pytest.raises(probe.ProbeError, match="num_hidden_groups=2 is not supported"):
        probe.load(tmp_path, init="random")


def test_wrap_needs_a_hf_model_of_a_supported_family():
    with pytest.raises(probe.ProbeError, match="HuggingFace model"):
        probe.wrap(torch.nn.Linear(2, 2))
    # An sdpa model is taken as it is: probe's copy runs eager, the caller's keeps sdpa.
    sdpa = tiny_model("bert")
    sdpa.config._attn_implementation = "sdpa"
    assert probe.wrap(sdpa).attn_implementation == "eager"
    assert sdpa.config._attn_implementation == "sdpa"


def test_an_unreachable_hub_is_not_asked(monkeypatch):
    """Offline, only the local cache is consulted (huggingface_hub would retry for ~25 s)."""
    from probe.loading import hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub.hub_reachable.cache_clear()
    monkeypatch.setattr(hub.socket, "create_connection", _refuse)
    try:
        assert hub.hub_kwargs("bert-base-uncased") == {"local_files_only": True}
    finally:
        hub.hub_reachable.cache_clear()


def _refuse(*args, **kwargs):
    raise OSError("network is unreachable")


def test_random_weights_that_are_not_finite_are_refused_naming_the_tensor(tmp_path):
    # The finiteness check of a random init is the same pass that finds tensors its skipped
    # default init left unset: an init range past float32 still gets the one-line refusal.
    from transformers import BertConfig

    BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
               vocab_size=50, initializer_range=1e39).save_pretrained(tmp_path)  # fmt: skip
    with pytest.raises(probe.ProbeError, match=r"random weights of .* are not finite: "
                       r"embeddings\.word_embeddings\.weight holds \d+ NaN or inf"):  # fmt: skip
        probe.load(tmp_path, init="random")


def test_the_finiteness_check_screens_by_sums_and_settles_overflow_entry_by_entry():
    # first_non_finite screens each tensor by its sum: a sum of finite float16 entries that
    # overflows (60000 x 4 > 65504) must not refuse them, and one NaN, one inf or an inf
    # beside a -inf (whose sum is NaN) among many finite entries must each be found.
    from probe.loading.audit import first_non_finite

    def module(**tensors):
        m = torch.nn.Module()
        for name, value in tensors.items():
            m.register_buffer(name, value)
        return m

    big = torch.full((4,), 60000.0, dtype=torch.float16)
    assert torch.isinf(big.sum())  # the screen fails; the entries are finite
    assert first_non_finite(module(a=big, ids=torch.arange(3))) is None
    for bad in (math.nan, math.inf, -math.inf):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            x = torch.zeros(1000, dtype=dtype)
            x[517] = bad
            key, tensor = first_non_finite(module(ok=torch.ones(3), x=x))
            assert key == "x" and tensor.data_ptr() == x.data_ptr()
    both = torch.zeros(10)
    both[2], both[7] = math.inf, -math.inf
    assert first_non_finite(module(both=both))[0] == "both"


def test_a_float64_checkpoint_runs_on_its_float64_weights(tmp_path):
    """Weights are read as stored: a float64 checkpoint run in float64 holds transformers' own
    float64 weights bit for bit (reading them in float32 first moved X_0 by 3e-8), and a run
    in another dtype than the stored one says so in its checkpoint attributes."""
    import transformers

    from tests.reference.tiny import TINY_CONFIGS

    name, kwargs = TINY_CONFIGS["llama"]
    config = getattr(transformers, name)(**kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).to(torch.float64)
    with torch.no_grad():  # values float32 cannot hold
        for parameter in model.parameters():
            parameter.add_(1e-9 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path / "tiny-llama-f64")
    folder = tmp_path / "tiny-llama-f64"
    probed = probe.load(folder, init="pretrained", dtype="float64")
    want = transformers.AutoModel.from_pretrained(folder, dtype=torch.float64)
    got = dict(probed.model.named_parameters())
    for key, value in want.named_parameters():
        assert got[key].dtype == torch.float64 and torch.equal(got[key], value), key
    assert "weights_stored_dtype" not in probed.checkpoint
    as32 = probe.load(folder, init="pretrained", dtype="float32")
    assert as32.checkpoint["weights_stored_dtype"] == "float64"
    assert "stored in float64" in as32.weights
    for key, value in want.named_parameters():  # one rounding to float32
        assert torch.equal(dict(as32.model.named_parameters())[key], value.float()), key


def _float64_llama(folder, config_dtype: str, safe: bool = True, mixed: bool = False):
    """A tiny float64 llama whose weights float32 cannot hold, saved with its config's
    ``dtype`` set to ``config_dtype`` (what the files hold is another matter); ``mixed``:
    its norms' weights stored in float32.  The state dict as the files hold it."""
    import json

    import transformers

    from tests.reference.tiny import TINY_CONFIGS

    name, kwargs = TINY_CONFIGS["llama"]
    config = getattr(transformers, name)(**kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).to(torch.float64)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1e-9 * torch.randn_like(parameter))
    if mixed:
        for module_name, module in model.named_modules():
            if module_name.endswith("norm"):
                module.float()
    model.save_pretrained(folder, safe_serialization=safe)
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    saved["dtype"] = config_dtype  # the config's word, not what the files hold
    path.write_text(json.dumps(saved))
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_the_stored_dtype_is_read_from_the_tensors_not_the_config(tmp_path, safe):
    """A float64 checkpoint whose config says float32: a float64 run holds its float64
    weights bit for bit (transformers' dtype="auto" reads the config's word and rounds them
    to float32), and no run calls them float32."""
    folder = tmp_path / "says-float32"
    stored = _float64_llama(folder, "float32", safe=safe)
    probed = probe.load(folder, init="pretrained", dtype="float64")
    got = probed.model.state_dict()
    for key, value in stored.items():
        assert got[key].dtype == torch.float64 and torch.equal(got[key], value), key
    assert "weights_stored_dtype" not in probed.checkpoint  # stored as the run runs
    as32 = probe.load(folder, init="pretrained", dtype="float32")
    assert as32.checkpoint["weights_stored_dtype"] == "float64"
    assert as32.weights.endswith("; stored in float64")


def test_a_checkpoint_of_mixed_dtypes_is_read_exactly_and_said_so(tmp_path):
    """float64 weights beside float32 norms: each tensor read exactly (the float32 ones
    widened, which is exact), and the attribute names both, with their counts."""
    folder = tmp_path / "mixed"
    stored = _float64_llama(folder, "float32", mixed=True)
    norms = sum(1 for v in stored.values() if v.dtype == torch.float32)
    probed = probe.load(folder, init="pretrained", dtype="float64")
    got = probed.model.state_dict()
    for key, value in stored.items():
        assert torch.equal(got[key], value.to(torch.float64)), key
    words = f"float64 ({len(stored) - norms} tensors) and float32 ({norms} tensors)"
    assert probed.checkpoint["weights_stored_dtype"] == words
    assert f"stored in {words}" in probed.weights
