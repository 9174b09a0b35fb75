"""The toy network's paths: sum over all paths = full forward; each path = the numpy oracle."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from probe.errors import ProbeError
from probe.paths import SKIP, all_paths
from probe.toy import ToyConfig, ToySAN
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
    _, last = toy_paths.full_forward(
        _state(model), toy_paths.embed_tokens(_state(model), ids.numpy()), DEPTH, HEADS
    )
    ours = model.trace(ids)["states"][-1].detach().numpy()
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
        assert torch.count_nonzero(model.path_states(ids, [(0, SKIP, SKIP)])) == 0
        assert torch.count_nonzero(model.path_states(ids, [(SKIP, SKIP, SKIP)])) > 0


def test_chain_mode_is_a_pure_chain_of_heads() -> None:
    """--no-sub-path: a head layer is LN(head output) with live statistics; skip bypasses."""
    model, ids = _tiny(7), _inputs(8)
    with torch.no_grad():
        full = model.trace(ids)
        x = full["states"][0]
        assert torch.equal(model.path_states(ids, [(SKIP,) * DEPTH], sub_path=False), x)
        layer = model.layers[1]
        w, b_v, b_o = layer.head_maps(1)
        expected = layer.norm(full["probs"][1][:, 1] @ x @ w + b_v + b_o)
        got = model.path_states(ids, [(SKIP, 1, SKIP)], sub_path=False)
        assert torch.allclose(got, expected, rtol=0, atol=1e-12)
        # The heads' value slices and output rows add up to the attention sublayer (eq. 1).
        first = model.layers[0]
        heads = sum(full["probs"][0][:, h] @ x @ first.head_maps(h)[0] for h in range(HEADS))
        consts = sum(first.head_maps(h)[1] for h in range(HEADS)) + first.out.bias
        assert torch.allclose(heads + consts, full["sums"][0] - x, rtol=0, atol=1e-12)


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


def test_the_model_is_not_modified_by_path_runs() -> None:
    model, ids = _tiny(9), _inputs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for sub in (True, False):
            model.forward_paths(ids, list(itertools.islice(all_paths(DEPTH, HEADS), 5)), sub)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_shared_trace_gives_the_same_paths() -> None:
    model, ids = _tiny(11), _inputs(12)
    paths = [(SKIP, 0, 1), (1, SKIP, SKIP)]
    with torch.no_grad():
        full = model.trace(ids)
        for sub in (True, False):
            assert torch.equal(
                model.forward_paths(ids, paths, sub, full=full),
                model.forward_paths(ids, paths, sub),
            )
