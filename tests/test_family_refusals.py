"""A family entry is refused or right: a table of wrong entries, each refused in one line
naming the family and the field at fault, and the families that need the entry's fields
beyond the layer (StableLM, Cohere, Granite) run end to end through the CLI.

Each wrong entry is made from a registered one by changing one field, as a user adding a
family would get it wrong.  It is refused where it is first knowable: when the entry is
made (a field that cannot mean anything), when a model is loaded (the entry checked
against the model's modules, :mod:`probe.models.conformance`), or by the self-test's
identities (:mod:`probe.surgery.self_test`), never with a traceback or a number.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import probe
from probe.cli.app import app
from probe.errors import ProbeError
from probe.files.results import open_result
from probe.models import ADAPTERS
from probe.models.builders import decoder, pre_ln
from probe.models.family import GATED_MLP, Heads, Logits, Mlp
from tests.reference.tiny import tiny_model, tiny_spec_model

runner = CliRunner()


def _llama_steps(norm: str):
    return pre_ln("self_attn", norm, ("post_attention_layernorm", "mlp"))


def _replace(**changes):
    return lambda spec: dataclasses.replace(spec, **changes)


#: (tiny model, its family, the wrong change, what the one line says).
WRONG = [
    # 1. A fused q|k|v layout on a plain value projection.
    (
        "llama",
        "llama",
        _replace(heads=Heads("self_attn.v_proj", "self_attn.o_proj", layout="fused")),
        "heads: layout 'fused' reads self_attn.v_proj as fused q|k|v rows",
    ),
    # 2. A plain value projection where the model has a fused one (Phi3's qkv_proj).
    (
        "phi3",
        "phi3",
        _replace(heads=Heads("self_attn.qkv_proj", "self_attn.o_proj")),
        "heads: layout 'linear' reads self_attn.qkv_proj as a value projection",
    ),
    # 3. StableLM's per-head q/k LayerNorms left out: taken for layer norms otherwise.
    (
        "stablelm",
        "stablelm",
        _replace(qk_norms=()),
        "qk_norms: self_attn.q_layernorm.norms.0 (LayerNorm) is a norm of the layer",
    ),
    # 4. Cohere's logit_scale not named.
    ("cohere", "cohere", _replace(logits=Logits()), "logits: the config's logit_scale (0.25)"),
    # 5. Gemma2's final soft cap not named.
    ("gemma2", "gemma2", _replace(logits=Logits()), "logits: the config's final_logit_softcapping"),
    # 6.-8. Granite's multipliers, one at a time.
    (
        "granite",
        "granite",
        _replace(residual_multiplier=""),
        "residual_multiplier: the config's residual_multiplier (0.5)",
    ),
    (
        "granite",
        "granite",
        _replace(embedding_multiplier=""),
        "embedding_multiplier: the config's embedding_multiplier (2.0)",
    ),
    (
        "granite",
        "granite",
        _replace(attention_multiplier=""),
        "attention_multiplier: the config's attention_multiplier (0.3)",
    ),
    # 9. A gated MLP declared as a plain one: its bounds would be for an MLP it does not have.
    (
        "llama",
        "llama",
        _replace(mlp=Mlp("mlp.up_proj", "mlp.down_proj")),
        "mlp: mlp does not compute mlp.down_proj(s(mlp.up_proj(x)))",
    ),
    # 10. A plain MLP with the wrong activation.
    (
        "gpt2",
        "gpt2",
        _replace(mlp=Mlp("mlp.c_fc", "mlp.c_proj", layout="conv1d", activation="relu")),
        "mlp: mlp does not compute mlp.c_proj(s(mlp.c_fc(x)))",
    ),
    # 11. The MLP branch at the MLP's input: branch scaling would scale the wrong value.
    (
        "llama",
        "llama",
        _replace(mlp_branch="post_attention_layernorm"),
        "MLP branch x alpha at post_attention_layernorm",
    ),
    # 12. A misspelled norm site, in the steps and the norm field alike.
    (
        "llama",
        "llama",
        _replace(steps=_llama_steps("input_layernorn"), norm="input_layernorn"),
        "norm: 'input_layernorn' is not a module of LlamaDecoderLayer",
    ),
    # 13.-14. A norm of the wrong kind.
    ("llama", "llama", _replace(norm_kind="layernorm"), "norm_kind: norm 'input_layernorm'"),
    ("gemma", "gemma", _replace(norm_kind="rms"), "norm_kind: norm 'input_layernorm'"),
    # 15. A static norm field beside steps that read another norm on this config.
    (
        "falcon",
        "falcon",
        _replace(norm="ln_attn"),
        "norm is 'ln_attn' but the step reading 'norm' reads 'input_layernorm'",
    ),
    # 16. Parallel StableLM's missing second norm named in the steps.
    (
        "stablelm-parallel",
        "stablelm",
        _replace(steps=_llama_steps("input_layernorm")),
        "steps: 'post_attention_layernorm' is not a module of StableLmDecoderLayer",
    ),
    # 17. A naive Llama-shaped entry for Cohere: its parallel layer has no second norm.
    (
        "cohere",
        "cohere",
        lambda spec: decoder("cohere", ("cohere",), logits=spec.logits, qk_norms=spec.qk_norms),
        "steps: 'post_attention_layernorm' is not a module of CohereDecoderLayer",
    ),
    # 18. The layer list misspelled.
    ("llama", "llama", _replace(layers="layer"), "layers: LlamaModel has no module 'layer'"),
    # 19. Two projections that are not one MLP.
    (
        "gpt2",
        "gpt2",
        _replace(mlp=Mlp("mlp.c_fc", "mlp.c_fc", layout="conv1d")),
        "mlp: mlp.c_fc (32 -> 128) and mlp.c_fc (32 -> 128) are not the two projections",
    ),
]


@pytest.mark.parametrize(
    "tiny, family, change, says", WRONG, ids=[f"{i + 1}-{row[0]}" for i, row in enumerate(WRONG)]
)
def test_a_wrong_entry_is_refused_in_one_line_naming_the_field(
    tiny, family, change, says, monkeypatch, tmp_path
):
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path))
    adapter = ADAPTERS[family]
    model = tiny_model(tiny) if tiny in ("bert", "gpt2") else tiny_spec_model(tiny)
    with pytest.raises(ProbeError) as err:
        monkeypatch.setattr(adapter, "spec", change(adapter.spec))
        probe.wrap(model)
    line = str(err.value)
    assert "\n" not in line and says in line, line
    assert repr(family) in line or f"the {family} spec" in line, line


def test_decoder_refuses_a_field_it_does_not_have_and_takes_any_it_has():
    with pytest.raises(ProbeError, match=r"family entry 'x': decoder\(\) has no field 'lm_heads'"):
        decoder("x", ("x",), lm_heads="")
    assert decoder("x", ("x",), lm_head="").lm_head == ""  # a Llama default replaced
    assert decoder("x", ("x",), mlp=GATED_MLP, final_norm="").final_norm == ""


def test_probe_check_shows_the_refusal_in_its_table(monkeypatch, tmp_path):
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "tiny-cohere"
    tiny_spec_model("cohere", dtype=torch.float32).save_pretrained(folder)
    adapter = ADAPTERS["cohere"]
    monkeypatch.setattr(adapter, "spec", dataclasses.replace(adapter.spec, logits=Logits()))
    result = runner.invoke(app, ["check", str(folder)])
    assert result.exit_code == 2 and "NO" in result.stdout
    assert "logit_scale" in " ".join(result.stdout.split())
    # The last line names the identity, the field at fault and why, not only the table.
    last = result.output.strip().splitlines()[-1]
    assert "entry = the model's modules fails" in last and "logits: the config's" in last


def test_a_hybrid_of_attention_and_other_mixers_is_refused_with_the_reason():
    from probe.models import adapter_for

    for model_type in ("jamba", "falcon_h1", "zamba2", "bamba"):
        with pytest.raises(ProbeError, match="is refused: a hybrid whose layers are partly"):
            adapter_for(model_type)
    with pytest.raises(ProbeError, match="tiny config and a reference entry in tests/reference"):
        adapter_for("not-a-family")


def test_a_long_message_is_cut_at_a_whole_word():
    from probe.errors import one_line

    text = one_line(ValueError("word " * 100 + "tail"))
    assert text.endswith("word ...") and len(text) <= 304
    assert one_line(ValueError("a\n  b")) == "a b"


# --- the families whose entries say what they compute beyond the layer -------------


#: The families whose entries say what they compute beyond the layer, and the families added
#: with the check against the model's own attention (their other config branches run through
#: the registry's tests and `probe collapse` in tests/test_families_cli.py).
BEYOND = ("stablelm", "stablelm-parallel", "cohere", "cohere-qk-norm", "granite", "gemma3",
          "phi", "gpt-bigcode-multi-head", "gpt-oss")  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    found = {}
    for name in BEYOND:
        folder = tmp_path_factory.mktemp("beyond") / f"tiny-{name}"
        tiny_spec_model(name, seed=1, dtype=torch.float32).save_pretrained(folder)
        found[name] = str(folder)
    return found


@pytest.mark.parametrize("name", BEYOND)
def test_check_collapse_attention_and_decompose_run_offline(name, folders, tmp_path):
    folder = folders[name]
    checked = runner.invoke(app, ["check", folder])
    assert checked.exit_code == 0, checked.output
    assert "all identities hold" in checked.stdout
    small = ["--sequences", "2", "--tokens", "6", "--quiet"]
    for extra in (["--variants", "all", "--no-layernorm"], ["--branch-scale", "0.5"]):
        out = tmp_path / extra[0]
        result = runner.invoke(app, ["collapse", folder, *extra, *small, "--out", str(out)])
        assert result.exit_code == 0, result.output
        [nc] = out.glob("collapse-*.nc")
        assert np.isfinite(open_result(nc).relative_residual.values).all()
    attention = runner.invoke(app, ["attention", folder, *small, "--out", str(tmp_path / "a")])
    assert attention.exit_code == 0, attention.output
    # GPT-OSS's learned sinks: their share beside the first token's, and what it means.
    learned = name == "gpt-oss"
    assert ("learned sink" in attention.stdout) == learned
    assert ("the attention has learned sink logits" in attention.stdout) == learned
    paths = runner.invoke(
        app,
        [
            "paths",
            "--decompose",
            folder,
            "--init",
            "pretrained",
            *small,
            "--out",
            str(tmp_path / "p"),
        ],
    )
    assert paths.exit_code == 0, paths.output
    [nc] = (tmp_path / "p").glob("paths-decompose-*.nc")
    ds = open_result(nc)
    # A tied head: the loss is the family's own (tested against HF); Phi's is not tied.
    assert ("loss_full" in ds) == (not name.startswith("phi"))
