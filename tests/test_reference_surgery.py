"""Sanity checks of the independent reference (tests/reference), without probe or nnsight.

The reference must (a) reproduce each model's own hidden states when nothing is
ablated, (b) really change them under every ablation while leaving the input model
untouched, and (c) agree with layers computed by hand from the model's parameters.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from transformers import BertForMaskedLM

from tests.reference.surgery import model_family, reference_hidden_states
from tests.reference.tiny import FAMILIES, tiny_config, tiny_model

TOL = 1e-10
VARIANTS = list(itertools.product([True, False], [True, False]))  # (attn_skip, mlp)
ABLATED = [v for v in VARIANTS if v != (True, True)]


def _ids(batch=2, tokens=7, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, tiny_config("bert").vocab_size - 1, (batch, tokens), generator=gen)


def _padded_mask(ids, real_tokens_last_row=5):
    mask = torch.ones_like(ids)
    mask[-1, real_tokens_last_row:] = 0
    return mask


def _close(a, b, tol=TOL):
    return a.shape == b.shape and (a - b).abs().max().item() <= tol


def _num_layers(model):
    return model.config.num_hidden_layers


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def model(family):
    return tiny_model(family)


# --- tiny models ------------------------------------------------------------------


def test_tiny_model_is_deterministic_eval_eager(family):
    a, b, c = tiny_model(family, seed=0), tiny_model(family, seed=0), tiny_model(family, seed=1)
    assert not a.training
    assert a.config._attn_implementation == "eager"
    assert next(a.parameters()).dtype == torch.float64
    assert model_family(a) == family
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert any(
        not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True)
    )
    if family == "albert":
        assert a.config.embedding_size != a.config.hidden_size
        assert a.config.num_hidden_layers == 3
        assert len(a.encoder.albert_layer_groups) == 1
        assert len(a.encoder.albert_layer_groups[0].albert_layers) == 1
    if family == "gpt2":
        assert a.config.n_positions >= 64


# --- (a) unablated reference == the model's own hidden states ----------------------


@pytest.mark.parametrize("padded", [False, True])
def test_unablated_reference_matches_model_hidden_states(model, family, padded):
    ids = _ids()
    mask = _padded_mask(ids) if padded else None
    ref = reference_hidden_states(model, ids, mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    hs = out.hidden_states
    n_layers = _num_layers(model)
    hidden = model.config.hidden_size
    assert len(ref) == n_layers + 1 == len(hs)
    for r in ref:
        assert r.shape == (*ids.shape, hidden)
        assert r.dtype == torch.float64

    if family == "gpt2":
        # hidden_states[0..L-1] are block inputs; hidden_states[-1] is replaced by
        # last_hidden_state, i.e. ln_f(last block output).
        for i in range(n_layers):
            assert _close(ref[i], hs[i]), i
        assert not _close(ref[-1], hs[-1], 1e-3)  # ours is before ln_f
        with torch.no_grad():
            assert _close(model.ln_f(ref[-1]), hs[-1])
        assert _close(model.ln_f(ref[-1]), out.last_hidden_state)
    else:
        for i in range(n_layers + 1):
            assert _close(ref[i], hs[i]), i
        assert _close(ref[-1], out.last_hidden_state)

    # Entry 0 is exactly the first layer's input, rebuilt from the embedding modules.
    with torch.no_grad():
        if family == "bert":
            x0 = model.embeddings(input_ids=ids)
        elif family == "albert":
            x0 = model.encoder.embedding_hidden_mapping_in(model.embeddings(input_ids=ids))
        elif family == "xlnet":
            x0 = model.word_embedding(ids)
        else:
            x0 = model.wte(ids) + model.wpe(torch.arange(ids.shape[1]))[None]
    assert _close(ref[0], x0)


# --- (b) ablations change the output and leave the model untouched ----------------


def _hook_and_forward_counts(model):
    return [
        (
            "forward" in m.__dict__,
            len(m._forward_hooks),
            len(m._forward_pre_hooks),
        )
        for m in model.modules()
    ]


@pytest.mark.parametrize(("attn_skip", "mlp"), ABLATED)
def test_ablation_differs_and_model_unchanged(family, attn_skip, mlp):
    model = tiny_model(family)
    ids = _ids()
    mask = _padded_mask(ids)
    params_before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks_before = _hook_and_forward_counts(model)
    with torch.no_grad():
        out_before = model(input_ids=ids, attention_mask=mask).last_hidden_state

    ablated = reference_hidden_states(model, ids, mask, attn_skip=attn_skip, mlp=mlp)
    plain = reference_hidden_states(model, ids, mask)

    assert len(ablated) == len(plain) == _num_layers(model) + 1
    assert _close(ablated[0], plain[0])  # the ablation acts inside the layers only
    for i in range(1, len(plain)):
        assert (ablated[i] - plain[i]).abs().max().item() > 1e-3, i
        assert torch.isfinite(ablated[i]).all()

    assert not model.training
    assert _hook_and_forward_counts(model) == hooks_before
    params_after = model.state_dict()
    assert params_after.keys() == params_before.keys()
    for k, v in params_before.items():
        assert torch.equal(v, params_after[k]), k
    with torch.no_grad():
        out_after = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(out_before, out_after)


@pytest.mark.parametrize(("attn_skip", "mlp"), VARIANTS)
def test_padding_is_masked(model, attn_skip, mlp):
    """Real tokens of a padded row equal the same row run alone without padding."""
    ids = _ids()
    real = 5
    padded = reference_hidden_states(
        model, ids, _padded_mask(ids, real), attn_skip=attn_skip, mlp=mlp
    )
    alone = reference_hidden_states(model, ids[-1:, :real], attn_skip=attn_skip, mlp=mlp)
    for p, a in zip(padded, alone, strict=True):
        assert _close(p[-1:, :real], a, 1e-9)


# --- (c) hand computations --------------------------------------------------------


def _attend(q, k, v, n_heads, causal=False):
    """softmax(q k^T / sqrt(d)) v over heads; q, k, v are (batch, token, hidden)."""
    b, t, h = q.shape
    d = h // n_heads
    q, k, v = (x.reshape(b, t, n_heads, d).transpose(1, 2) for x in (q, k, v))
    scores = q @ k.transpose(-1, -2) / d**0.5
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h)


def _ln(x, norm):
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def _linear(x, lin):
    return x @ lin.weight.T + lin.bias


def test_bert_no_skip_no_mlp_layer1_by_hand():
    """Layer 1 output = LayerNorm(dense(context)), context from layer 0's BertSelfAttention."""
    model = tiny_model("bert")
    ids = _ids()
    ref = reference_hidden_states(model, ids, attn_skip=False, mlp=False)
    layer = model.encoder.layer[0]
    with torch.no_grad():
        x0 = model.embeddings(input_ids=ids)
        context, _ = layer.attention.self(x0)
        so = layer.attention.output
        expected = _ln(_linear(context, so.dense), so.LayerNorm)
        # the residual really is gone: keeping it gives something else
        with_skip = _ln(_linear(context, so.dense) + x0, so.LayerNorm)
    assert _close(ref[0], x0)
    assert _close(ref[1], expected)
    assert not _close(ref[1], with_skip, 1e-3)


def _bert_like_layer(x, attn, attn_out, attn_ln, ffn, attn_skip, mlp, n_heads):
    """attn = (query, key, value) Linears; attn_out = dense; ffn = callable a -> mlp(a)+a normed."""
    context = _attend(*(_linear(x, lin) for lin in attn), n_heads)
    y = _linear(context, attn_out)
    a = _ln(y + x if attn_skip else y, attn_ln)
    return ffn(a) if mlp else a


def _hand_layer(model, family, index, x, attn_skip, mlp):
    n = model.config.num_attention_heads
    if family == "bert":
        layer = model.encoder.layer[index]
        sa, so, out = layer.attention.self, layer.attention.output, layer.output

        def ffn(a):
            inter = F.gelu(_linear(a, layer.intermediate.dense))  # hidden_act "gelu" (erf)
            return _ln(_linear(inter, out.dense) + a, out.LayerNorm)

        return _bert_like_layer(
            x, (sa.query, sa.key, sa.value), so.dense, so.LayerNorm, ffn, attn_skip, mlp, n
        )
    if family == "albert":
        layer = model.encoder.albert_layer_groups[0].albert_layers[0]  # shared by all
        att = layer.attention

        def ffn(a):
            inner = F.gelu(_linear(a, layer.ffn), approximate="tanh")  # "gelu_new"
            return _ln(_linear(inner, layer.ffn_output) + a, layer.full_layer_layer_norm)

        return _bert_like_layer(
            x, (att.query, att.key, att.value), att.dense, att.LayerNorm, ffn, attn_skip, mlp, n
        )
    if family == "gpt2":
        block = model.h[index]
        h = _ln(x, block.ln_1)
        qkv = h @ block.attn.c_attn.weight + block.attn.c_attn.bias  # Conv1D: x W + b
        context = _attend(*qkv.split(x.shape[-1], dim=-1), n, causal=True)
        attn_out = context @ block.attn.c_proj.weight + block.attn.c_proj.bias
        a = attn_out + x if attn_skip else attn_out
        if not mlp:
            return a
        m = _ln(a, block.ln_2)
        m = F.gelu(m @ block.mlp.c_fc.weight + block.mlp.c_fc.bias, approximate="tanh")
        return a + m @ block.mlp.c_proj.weight + block.mlp.c_proj.bias
    raise AssertionError(family)


@pytest.mark.parametrize("family_", ["bert", "albert", "gpt2"])
@pytest.mark.parametrize(("attn_skip", "mlp"), VARIANTS)
def test_every_layer_by_hand(family_, attn_skip, mlp):
    """Each entry l+1 = layer l applied by hand to entry l (ALBERT: the shared layer, every time)."""
    model = tiny_model(family_)
    ids = _ids()
    ref = reference_hidden_states(model, ids, attn_skip=attn_skip, mlp=mlp)
    with torch.no_grad():
        for i in range(_num_layers(model)):
            expected = _hand_layer(model, family_, i, ref[i], attn_skip, mlp)
            assert _close(ref[i + 1], expected, 1e-9), i


def test_mlp_off_layer1_is_the_models_attention_sublayer_output(model, family):
    """With mlp=False, layer 1 = the unablated model's first attention sublayer output."""
    ids = _ids()
    mask = _padded_mask(ids)
    ref = reference_hidden_states(model, ids, mask, mlp=False)
    spy = copy.deepcopy(model)  # hooks go on a copy
    seen = []
    if family == "bert":
        target = spy.encoder.layer[0].attention
    elif family == "albert":
        target = spy.encoder.albert_layer_groups[0].albert_layers[0].attention
    elif family == "xlnet":
        target = spy.layer[0].rel_attn
    else:
        target = spy.h[0].attn
    target.register_forward_hook(lambda m, a, out: seen.append(out[0]))
    with torch.no_grad():
        spy(input_ids=ids, attention_mask=mask)
    first = seen[0]
    if family == "xlnet":
        first = first.transpose(0, 1)
    if family == "gpt2":
        first = first + ref[0]  # GPT2Attention returns attn(ln_1(x)); the block adds x
    assert _close(ref[1], first)


def test_xlnet_no_skip_equals_hf_post_attention_without_residual():
    """Cross-check against XLNet's own post_attention(..., residual=False) on both layers."""
    model = tiny_model("xlnet")
    ids = _ids()
    mask = _padded_mask(ids)
    for mlp in (True, False):
        ref = reference_hidden_states(model, ids, mask, attn_skip=False, mlp=mlp)
        other = copy.deepcopy(model)
        for layer in other.layer:
            ra = layer.rel_attn
            ra.post_attention = lambda h, v, residual=True, ra=ra: type(ra).post_attention(
                ra, h, v, residual=False
            )
            if not mlp:
                layer.ff = torch.nn.Identity()
        with torch.no_grad():
            hs = other(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        assert len(hs) == len(ref)
        for r, h in zip(ref, hs, strict=True):
            assert _close(r, h)


# --- input validation ---------------------------------------------------------------


def test_rejects_unknown_models_and_bad_batches():
    ids = _ids()
    with pytest.raises(ValueError):
        reference_hidden_states(torch.nn.Linear(3, 3), ids)
    torch.manual_seed(0)
    with pytest.raises(ValueError):
        reference_hidden_states(BertForMaskedLM(tiny_config("bert")).eval(), ids)
    with pytest.raises(ValueError):
        model_family(object())
    bert = tiny_model("bert")
    with pytest.raises(ValueError):
        reference_hidden_states(bert, ids[0])  # 1-D
    with pytest.raises(ValueError):
        reference_hidden_states(bert, ids.double())  # not token ids
    with pytest.raises(ValueError):
        reference_hidden_states(bert, ids, torch.ones(2, 3, dtype=torch.long))  # mask shape


# --- the removal variants' reference (tests/reference/removals.py) -------------------


@pytest.mark.parametrize("family_", ["bert", "gpt2"])
def test_removal_references_with_nothing_to_remove_are_the_model(family_):
    """With no sink and no massive entry, both references give the model's own stream
    (their eager attention is the model's, to rounding); a removal then changes it."""
    from tests.reference.removals import no_massive_hidden_states, no_sink_hidden_states

    model = tiny_model(family_)
    ids = _ids()
    inputs = {"input_ids": ids, "attention_mask": _padded_mask(ids)}
    plain = reference_hidden_states(model, ids, inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    for got in (
        no_sink_hidden_states(model, inputs, ()),
        no_massive_hidden_states(model, inputs, ()),
    ):
        assert all(_close(g[real], p[real]) for g, p in zip(got, plain, strict=True))
    removed = no_sink_hidden_states(model, inputs, ((1, 0, 1), (2, 3, 2)))
    assert (removed[-1][real] - plain[-1][real]).abs().max() > 1e-3
    replaced = no_massive_hidden_states(model, inputs, ((1, 2, 3, 9.5),))
    assert torch.equal(replaced[1][:, 2, 3], torch.full((2,), 9.5, dtype=torch.float64))
