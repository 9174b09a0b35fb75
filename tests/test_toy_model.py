"""The toy network and its paths against the numpy oracle and hand computations.

Exact decomposition: the sum over all paths is the full forward, each path its
oracle term.  Chains (the paper's --no-sub-path): every combination of the
attention rule (own, full) and the norm rule (paper, trained) against the
oracle's chains, and by hand on a two-dimensional network.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from probe.errors import ProbeError
from probe.measures.path_vocabulary import SKIP, all_paths
from probe.toy import ToyConfig, ToySAN
from probe.toy.model import plain_norm
from tests.reference import toy_paths

DEPTH, HEADS = 3, 2


def _tiny(seed: int = 0, **kw) -> ToySAN:
    torch.manual_seed(seed)
    cfg = ToyConfig(hidden=8, heads=HEADS, depth=DEPTH, n_out=3, vocab=11, max_len=6, **kw)
    model = ToySAN(cfg).double().eval()
    # Redraw everything (biases, LayerNorm gains and shifts included) so that a bias
    # or normalisation in the wrong place cannot hide behind zeros and ones.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.3 * torch.randn_like(param))
            else:
                param.copy_(0.5 * torch.randn_like(param))
    return model


def _inputs(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(seed))


def _state(model: ToySAN) -> dict:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_full_forward_matches_the_oracle() -> None:
    model, ids = _tiny(), _inputs()
    x0 = toy_paths.embed_tokens(_state(model), ids.numpy())
    _, last = toy_paths.full_forward(_state(model), x0, DEPTH, HEADS)
    trace = model.trace(ids)
    np.testing.assert_allclose(trace["states"][0].detach().numpy(), x0, rtol=0, atol=1e-12)
    ours = trace["states"][-1].detach().numpy()
    # Same float64 arithmetic in a different order (einsum vs matmul): a few ulps of O(1) values.
    np.testing.assert_allclose(ours, last, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sum_over_all_paths_is_the_full_forward(seed: int) -> None:
    model, ids = _tiny(seed), _inputs(seed + 10)
    paths = list(all_paths(DEPTH, HEADS))
    assert len(paths) == (HEADS + 1) ** DEPTH
    with torch.no_grad():
        summed = model.path_states(ids, paths)
        one_by_one = sum(model.path_states(ids, [p]) for p in paths)
        full = model.trace(ids)["states"][-1]
        logits = model.forward_paths(ids, paths)
    # 27 float64 terms of size O(1) summed: the error is a few ulps, far below 1e-10.
    assert torch.allclose(summed, full, rtol=0, atol=1e-10)
    assert torch.allclose(one_by_one, full, rtol=0, atol=1e-10)
    assert torch.allclose(logits, model(ids), rtol=0, atol=1e-10)


def test_each_path_matches_the_oracle() -> None:
    model, ids = _tiny(3), _inputs(4)
    sd = _state(model)
    terms = toy_paths.path_terms(sd, toy_paths.embed_tokens(sd, ids.numpy()), DEPTH, HEADS)
    for path in all_paths(DEPTH, HEADS):
        with torch.no_grad():
            ours = model.path_states(ids, [path]).numpy()
        # Per-path terms are O(1); float64 with different operation order: 1e-10 is loose.
        np.testing.assert_allclose(ours, terms[path], rtol=0, atol=1e-10, err_msg=str(path))


def test_constants_ride_the_all_skip_prefix() -> None:
    """A path that enters a head at layer 1 carries no constant: zero input, zero output."""
    model = _tiny(5)
    ids = _inputs(6)
    with torch.no_grad():
        model.embed.weight.zero_()
        model.position.weight.zero_()
        model.embed_norm.bias.zero_()  # LN(0) = its shift: zero it too, so X_0 = 0
        assert torch.count_nonzero(model.path_states(ids, [(0, SKIP, SKIP)])) == 0
        assert torch.count_nonzero(model.path_states(ids, [(SKIP, SKIP, SKIP)])) > 0


RULES = [(a, n) for a in ("own", "full") for n in ("paper", "trained")]


@pytest.mark.parametrize("attention, norm", RULES)
def test_chains_match_the_oracle(attention: str, norm: str) -> None:
    model, ids = _tiny(7), _inputs(8)
    sd = _state(model)
    x0 = toy_paths.embed_tokens(sd, ids.numpy())
    sets = [
        [(SKIP,) * DEPTH],
        [(SKIP, 1, SKIP)],
        [(0, SKIP, 1), (1, 1, SKIP), (SKIP, SKIP, 0)],
        list(itertools.islice(all_paths(DEPTH, HEADS), 3, 12)),
    ]
    for paths in sets:
        want = toy_paths.chain_sum(sd, x0, paths, DEPTH, HEADS, attention, norm)
        with torch.no_grad():
            got = model.path_states(ids, paths, sub_path=False, attention=attention, norm=norm)
        # float64, a few LayerNorms of O(1) values in another order of operations: ulps.
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12, err_msg=str(paths))


def test_the_rules_differ_where_they_should() -> None:
    """own vs full: only where a head sees a state other than the full model's at that
    layer; paper vs trained: whenever a head is on the path (trained gains are not 1)."""
    model, ids = _tiny(13), _inputs(14)
    with torch.no_grad():

        def run(path, attention, norm):
            return model.path_states(ids, [path], sub_path=False, attention=attention, norm=norm)

        # A head at layer 1 sees X_0 in the path and in the full model: same attention.
        assert torch.equal(
            run((1, SKIP, SKIP), "own", "trained"), run((1, SKIP, SKIP), "full", "trained")
        )
        # A head at layer 2 after a skip sees X_0 in the path but X_1 in the full model.
        assert not torch.allclose(
            run((SKIP, 0, SKIP), "own", "trained"), run((SKIP, 0, SKIP), "full", "trained")
        )
        assert not torch.allclose(
            run((0, SKIP, SKIP), "own", "paper"), run((0, SKIP, SKIP), "own", "trained")
        )
        # The all-skip chain is X_0 itself; the paper's rule normalises it once more.
        x0 = model.trace(ids)["states"][0]
        assert torch.equal(run((SKIP,) * DEPTH, "own", "trained"), x0)
        assert torch.equal(run((SKIP,) * DEPTH, "own", "paper"), plain_norm(x0, model.cfg.eps))


def test_paper_norm_by_hand_in_two_dimensions() -> None:
    """In two dimensions a LayerNorm without scale and shift maps (a, b) to
    (a - b, b - a) / sqrt((a - b)^2 + 4 eps): (1, -1) or (-1, 1) up to eps.  So under the
    paper's rule a path's output ignores the trained gain and shift, which the trained
    rule applies; and the sum of two such chains normalises to the same pattern."""
    torch.manual_seed(0)
    model = ToySAN(ToyConfig(hidden=2, heads=1, depth=1, n_out=2, vocab=5)).double().eval()
    with torch.no_grad():
        model.layers[0].norm.weight.fill_(5.0)
        model.layers[0].norm.bias.fill_(3.0)
        ids = torch.tensor([[0, 1, 2, 3]])
        paper = model.path_states(ids, [(0,)], sub_path=False, norm="paper")
        trained = model.path_states(ids, [(0,)], sub_path=False, norm="trained")
        layer = model.layers[0]
        x0 = model.trace(ids)["states"][0]
        w, b_v, b_o = layer.head_maps(0)
        z = layer.attention(x0)[:, 0] @ x0 @ w + b_v + b_o  # (1, 4, 2)
        gap = z[..., 0] - z[..., 1]
        one = torch.stack([gap, -gap], -1) / torch.sqrt(gap[..., None] ** 2 + 4 * model.cfg.eps)
        assert torch.allclose(trained, 5.0 * one + 3.0, rtol=0, atol=1e-12)
        # The final LayerNorm of the one-path sum normalises (u, -u) once more, to
        # (u, -u) / sqrt(u^2 + eps): (1, -1) or (-1, 1) up to eps.
        u = one[..., :1]
        assert torch.allclose(paper, one / torch.sqrt(u**2 + model.cfg.eps), rtol=0, atol=1e-12)
        assert torch.allclose(paper.abs(), torch.ones_like(paper), rtol=0, atol=1e-9)
        # Two copies of the path: the sum is 2 (u, -u), normalised to the same pattern.
        twice = model.path_states(ids, [(0,), (0,)], sub_path=False, norm="paper")
        assert torch.allclose(twice, one / torch.sqrt(u**2 + model.cfg.eps / 4), rtol=0, atol=1e-12)


def test_heads_add_up_to_the_attention_sublayer() -> None:
    """The heads' value slices and output rows add up to the attention sublayer (eq. 1)."""
    model, ids = _tiny(7), _inputs(8)
    with torch.no_grad():
        full = model.trace(ids)
        x = full["states"][0]
        first = model.layers[0]
        heads = sum(full["probs"][0][:, h] @ x @ first.head_maps(h)[0] for h in range(HEADS))
        consts = sum(first.head_maps(h)[1] for h in range(HEADS)) + first.out.bias
        assert torch.allclose(heads + consts, full["sums"][0] - x, rtol=0, atol=1e-12)


def test_bert_initialisation() -> None:
    """BERT's init (the paper's): N(0, 0.02) weights and zero biases everywhere except the
    value and output projections, which keep PyTorch's Kaiming-uniform draw, bound 1/sqrt(D)."""
    torch.manual_seed(0)
    d = 256
    model = ToySAN(ToyConfig(hidden=d, heads=4, depth=2, n_out=3, vocab=400, max_len=8))
    layer = model.layers[1]
    for w in (model.embed.weight, model.position.weight, layer.query.weight, model.readout.weight):
        # std of >= 2,000 N(0, 0.02) draws: within 10% of 0.02 (about 3 standard errors).
        assert abs(float(w.detach().std()) - 0.02) < 0.002
    for b in (layer.query.bias, layer.value.bias, layer.out.bias, model.readout.bias):
        assert torch.count_nonzero(b) == 0
    bound = 1 / d**0.5
    for w in (layer.value.weight, layer.out.weight):
        peak = float(w.detach().abs().max())
        assert 0.9 * bound < peak <= bound
    assert torch.equal(model.embed_norm.weight, torch.ones(d))
    plain = ToySAN(ToyConfig(hidden=d, heads=4, depth=2, n_out=3, vocab=400, init="torch"))
    assert float(plain.embed.weight.detach().std()) > 0.5  # PyTorch's N(0, 1) embedding


def test_dropout_only_while_training() -> None:
    model, ids = _tiny(3), _inputs(4)
    with torch.no_grad():
        a, b = model(ids), model(ids)
        assert torch.equal(a, b)  # eval: deterministic
        model.train()
        c, d = model(ids), model(ids)
        model.eval()
    assert not torch.equal(c, d) and not torch.allclose(a, c)


def test_paths_refuse_mlp_and_no_skip_and_bad_paths() -> None:
    ids = _inputs()
    with pytest.raises(ProbeError, match="skip connection and no MLP"):
        _tiny(mlp=True).path_states(ids, [(SKIP,) * DEPTH])
    with pytest.raises(ProbeError, match="skip connection and no MLP"):
        _tiny(skip=False).path_states(ids, [(SKIP,) * DEPTH])
    with pytest.raises(ProbeError, match="does not fit"):
        _tiny().path_states(ids, [(SKIP, 2, SKIP)])
    with pytest.raises(ProbeError, match="does not fit"):
        _tiny().path_states(ids, [(SKIP, SKIP)])
    with pytest.raises(ProbeError, match="path attention"):
        _tiny().path_states(ids, [(SKIP,) * DEPTH], sub_path=False, attention="mean")
    with pytest.raises(ProbeError, match="path norm"):
        _tiny().path_states(ids, [(SKIP,) * DEPTH], sub_path=False, norm="frozen")


def test_the_model_is_not_modified_by_path_runs() -> None:
    model, ids = _tiny(9), _inputs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    some = list(itertools.islice(all_paths(DEPTH, HEADS), 5))
    with torch.no_grad():
        model.forward_paths(ids, some, True)
        for attention, norm in RULES:
            model.forward_paths(ids, some, False, attention=attention, norm=norm)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_shared_trace_gives_the_same_paths() -> None:
    model, ids = _tiny(11), _inputs(12)
    paths = [(SKIP, 0, 1), (1, SKIP, SKIP)]
    with torch.no_grad():
        full = model.trace(ids)
        for sub in (True, False):
            for attention, norm in RULES:
                assert torch.equal(
                    model.forward_paths(ids, paths, sub, full, attention, norm),
                    model.forward_paths(ids, paths, sub, None, attention, norm),
                )
