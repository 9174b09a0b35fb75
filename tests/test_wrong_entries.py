"""Wrong entries of the families GPT-OSS, Gemma 3, Phi and GPT-BigCode, each refused in one
line that names the entry's field at fault.

Each row is a plausible mistake of someone adding the family by docs/adding-a-family.md: a
field changed from the registry's entry, tried on the family's tiny model (or the config
branch the mistake concerns).  Where the mistake cannot mean anything, it is refused when
the entry is made (``probe.models.family.validate``); where it contradicts the model's own
modules, by the check against them (``probe.models.conformance``); where only a run shows
it, by the self-test's identities when the model is loaded (a skip that returns what the
layer cannot take, a branch scaled where it is a tuple), or by the identity `probe check`
holds the heads to (``probe.analyses.path_checks``: a layout whose shapes fit but whose
rows are not the heads'), which every analysis that reads them asks.  None of them runs.
"""

from __future__ import annotations

import dataclasses
import re
from functools import cache

import pytest

from probe.analyses import path_checks
from probe.errors import ProbeError
from probe.models import ADAPTERS
from probe.models.builders import pre_ln
from probe.models.conformance import check_entry
from probe.models.family import GATED_MLP, Heads, Logits, Mlp
from tests.reference.tiny import TINY_VARIANTS, tiny_spec_model


def _heads(value="self_attn.v_proj", output="self_attn.o_proj", layout="linear", kv=0):
    return Heads(value, output, layout, kv)


_PHI_HEADS = _heads(output="self_attn.dense")
_BIGCODE = ("attn.c_attn", "attn.c_proj")

#: (tiny model, field at fault, the entry's changes): a wrong entry, refused naming field.
ROWS = [
    # GPT-OSS
    (
        "gpt-oss",
        "steps",
        {"steps": pre_ln("self_attn", "input_layernorm", ("post_attention_layernorm", "mlp"))},
    ),
    ("gpt-oss", "mlp_branch", {"mlp_branch": "mlp"}),
    ("gpt-oss", "norm_kind", {"norm_kind": "layernorm"}),
    ("gpt-oss", "heads", {"heads": _heads(layout="fused")}),
    ("gpt-oss", "heads", {"heads": _heads(kv=4)}),
    ("gpt-oss", "mlp", {"mlp": Mlp("mlp.router", "mlp.experts")}),
    ("gpt-oss", "layers", {"layers": "h"}),
    # Phi
    ("phi", "norm_kind", {"norm_kind": "rms"}),
    ("phi", "heads", {"heads": dataclasses.replace(_PHI_HEADS, layout="fused")}),
    ("phi", "heads", {"heads": _heads("self_attn.q_proj", "self_attn.dense")}),
    ("phi", "heads", {"heads": _heads(output="self_attn.o_proj")}),
    ("phi", "heads", {"heads": dataclasses.replace(_PHI_HEADS, kv_heads=4)}),
    ("phi", "mlp", {"mlp": GATED_MLP}),
    ("phi", "mlp", {"mlp": Mlp("mlp.fc1", "mlp.fc2", activation="gelu")}),
    ("phi", "mlp", {"mlp": Mlp("mlp.fc2", "mlp.fc1")}),
    ("phi", "mlp", {"mlp": Mlp("mlp.fc1", "mlp.fc2", layout="conv1d")}),
    ("phi-qk-layernorm", "qk_norms", {"qk_norms": ()}),
    (
        "phi",
        "steps",
        {"steps": pre_ln("self_attn", "input_layernorm", ("post_attention_layernorm", "mlp"))},
    ),
    ("phi", "layers", {"layers": "h"}),
    ("phi", "norm", {"norm": "final_layernorm"}),
    # Gemma 3
    ("gemma3", "norm_kind", {"norm_kind": "rms"}),
    ("gemma3", "norm_kind", {"norm_kind": "layernorm"}),
    ("gemma3", "qk_norms", {"qk_norms": ()}),
    ("gemma3", "logits", {"logits": Logits()}),
    ("gemma3", "mlp", {"mlp": Mlp("mlp.up_proj", "mlp.down_proj")}),
    ("gemma3", "mlp", {"mlp": Mlp("mlp.gate_proj", "mlp.down_proj", activation="gelu")}),
    ("gemma3", "heads", {"heads": _heads(layout="fused")}),
    ("gemma3", "heads", {"heads": _heads(kv=1)}),
    ("gemma3", "heads", {"heads": _heads("self_attn.k_proj", "self_attn.q_proj")}),
    ("gemma3", "branch_norm", {"style": "pre"}),
    ("gemma3", "mlp_branch", {"mlp_branch": ""}),
    ("gemma3", "layers", {"layers": "model.layers"}),
    # GPT-BigCode, each config branch
    ("gpt-bigcode", "heads", {"heads": Heads(*_BIGCODE, layout="neox")}),
    ("gpt-bigcode", "heads", {"heads": Heads(*_BIGCODE, layout="conv1d")}),
    ("gpt-bigcode", "heads", {"heads": Heads(*_BIGCODE, layout="fused", kv_heads=2)}),
    ("gpt-bigcode-multi-head", "heads", {"heads": Heads(*_BIGCODE, layout="fused", kv_heads=1)}),
    ("gpt-bigcode-multi-head", "heads", {"heads": Heads(*_BIGCODE, layout="fused")}),
    ("gpt-bigcode", "norm_kind", {"norm_kind": "rms"}),
    ("gpt-bigcode", "mlp", {"mlp": GATED_MLP}),
    ("gpt-bigcode", "mlp", {"mlp": Mlp("mlp.c_fc", "mlp.c_proj", activation="gelu")}),
    ("gpt-bigcode", "mlp", {"mlp": Mlp("mlp.c_fc", "mlp.c_proj", layout="conv1d")}),
    ("gpt-bigcode", "steps", {"steps": pre_ln("attn", "ln_1", ("mlp",))}),
    ("gpt-bigcode", "norm", {"norm": "ln_2"}),
    ("gpt-bigcode", "layers", {"layers": "layers"}),
]
FAMILY = ("phi", "gemma3", "gpt-bigcode", "gpt-oss")


@cache
def _model(name: str):
    return tiny_spec_model(name)


def _family(name: str) -> str:
    """The family of a tiny model: a config branch's, as TINY_VARIANTS says."""
    return TINY_VARIANTS.get(name, (name,))[0]


def _refusal(name: str, changes: dict, monkeypatch) -> str:
    """The one line that refuses the wrong entry, from whichever check comes first."""
    adapter = ADAPTERS[_family(name)]
    try:
        wrong = dataclasses.replace(adapter.spec, **changes)
    except ProbeError as err:  # refused when the entry is made
        return str(err)
    model = _model(name)
    try:
        check_entry(wrong, model)
    except ProbeError as err:
        return str(err)
    import probe

    monkeypatch.setattr(adapter, "spec", wrong)
    try:
        probed = probe.wrap(model)  # the self-test's identities
    except ProbeError as err:
        return str(err)
    return path_checks.problem(probed, "heads")


def test_the_table_is_large_and_covers_each_family():
    assert len(ROWS) >= 30
    assert {_family(name) for name, _, _ in ROWS} == set(FAMILY)


@pytest.mark.parametrize(("name", "field", "changes"), ROWS, ids=lambda v: str(v)[:40])
def test_a_wrong_entry_is_refused_in_one_line_naming_its_field(
    name, field, changes, monkeypatch, tmp_path
):
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path))  # no pass remembered
    said = _refusal(name, changes, monkeypatch)
    assert said, f"{name} ran with {changes}"
    assert "\n" not in said
    # The field as the line's subject: "family entry 'NAME': FIELD: ..." (the modules),
    # "family entry 'NAME': FIELD is ..." (the entry made) or "the entry's FIELD does not ...".
    assert re.search(rf"(': |entry's ){re.escape(field)}(:| )", said), said
    assert ADAPTERS[_family(name)].spec.name in said or "probe check" in said, said


@pytest.mark.parametrize("name", ["phi", "phi-qk-layernorm", "gemma3", "gpt-bigcode",
                                  "gpt-bigcode-multi-head", "gpt-oss"])  # fmt: skip
def test_the_right_entry_passes_every_check_of_the_table(name, monkeypatch, tmp_path):
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path))
    assert _refusal(name, {}, monkeypatch) == ""
