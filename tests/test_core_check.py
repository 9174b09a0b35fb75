"""The self-test holds probe's attention core against the model's own attention function
(probe.surgery.core_check), not against itself: a core that leaves out a feature the
model's attention computes is caught, on the families that have the feature, and the model
is refused in one line naming its family.  Each feature is removed from probe's core here
in turn (the soft-cap, T5's relative position bias, the model's own scaling, the mask, the
key/value heads' grouping, GPT-OSS's learned sink logits); with every feature in place the
identity holds on every tiny family (tests/test_families.py)."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.errors import ProbeError
from probe.models import attention
from probe.surgery import core_check, self_test
from tests.test_families import _model

REAL = attention.probe_eager


def _without(feature: str):
    """probe's core with ``feature`` left out."""

    def core(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
             softcap=None, **kwargs):  # fmt: skip
        if feature == "softcap":
            softcap = None
        elif feature == "position_bias":
            kwargs.pop("position_bias", None)
        elif feature == "scaling":
            scaling = None
        elif feature == "mask":
            attention_mask = None
        elif feature == "sinks":
            kwargs.pop("s_aux", None)
        elif feature == "grouping":
            heads = key.shape[1]
            query = query[:, :heads]  # the query heads of the first group only
        return REAL(module, query, key, value, attention_mask, scaling, dropout, softcap,
                    **kwargs)  # fmt: skip

    return core


#: (feature, a tiny family whose attention has it)
CASES = [
    ("softcap", "gemma2"),
    ("position_bias", "t5"),
    ("scaling", "granite"),  # attention_multiplier replaces 1/sqrt(d)
    ("mask", "llama"),
    ("mask", "bert"),  # its padding
    ("grouping", "mistral"),
    ("sinks", "gpt-oss"),  # learned per-head sink logits (s_aux)
]


@pytest.mark.parametrize(("feature", "name"), CASES, ids=[f"{f}-{n}" for f, n in CASES])
def test_a_core_that_leaves_out_a_feature_is_caught(feature, name, monkeypatch):
    model = _model(name, dtype=torch.float32)
    probed = probe.wrap(model)  # verified with the real core
    data, mask = self_test._inputs(probed, None, None)
    if feature == "mask":
        mask = torch.ones_like(mask)
        mask[:, -2:] = 0  # padding, so that a bidirectional model's mask is not all open
    assert core_check.identity(probed, data, mask).holds()  # the real core: it holds
    monkeypatch.setattr(attention, "probe_eager", _without(feature))
    found = core_check.identity(probed, data, mask)
    assert not found.holds() and found.max_diff > 100 * found.bound, found
    assert f"what the {probed.family} attention computes" in found.error
    assert "\n" not in found.error


def test_a_model_whose_attention_the_core_cannot_compute_is_refused_at_load(monkeypatch, tmp_path):
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path))  # no pass remembered
    model = _model("gemma2", dtype=torch.float32)
    monkeypatch.setattr(attention, "probe_eager", _without("softcap"))
    with pytest.raises(ProbeError, match="probe's attention core does not compute") as caught:
        probe.wrap(model)
    assert "gemma2" in str(caught.value) and "refused" in str(caught.value)


def test_a_keyword_the_core_does_not_read_is_named(monkeypatch):
    """A family whose attention function takes what probe's core never reads (here a bias
    on the keys' scores, passed as a keyword) is refused naming the keyword."""
    model = _model("llama", dtype=torch.float32)
    probed = probe.wrap(model)  # verified with the real core
    data, mask = self_test._inputs(probed, None, None)
    own = __import__(type(probed.model.layers[0].self_attn).__module__, fromlist=["x"])
    bias = torch.linspace(-3.0, 3.0, data.shape[1])

    def with_bias(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  key_bias=None, **kwargs):  # fmt: skip
        group = query.shape[1] // key.shape[1]
        scores = torch.matmul(query, key.repeat_interleave(group, 1).transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask[..., : key.shape[-2]]
        if key_bias is not None:
            scores = scores + key_bias.view(1, 1, 1, -1)
        probs = torch.softmax(scores, -1)
        values = value.repeat_interleave(group, 1)
        return torch.matmul(probs, values).transpose(1, 2).contiguous(), probs

    monkeypatch.setattr(own, "eager_attention_forward", with_bias)
    original = core_check._calls

    def calls_with_bias(probed, data, mask):
        return [(m, {**a, "key_bias": bias.to(a["query"].dtype)}, o)
                for m, a, o in original(probed, data, mask)]  # fmt: skip

    monkeypatch.setattr(core_check, "_calls", calls_with_bias)
    found = core_check.identity(probed, data, mask)
    assert not found.holds() and "also takes key_bias" in found.error, found
