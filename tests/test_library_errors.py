"""The library's contract for bad values: one ProbeError line naming the parameter.

Every parameter of ``probe.Inputs``, ``sweep.plan``/``sweep.run`` and ``attention.run`` that
a caller can get wrong is refused with :class:`probe.errors.ProbeError` (never a raw
TypeError, ValueError, IndexError or AttributeError), on one line that names the parameter
in backticks.  numpy scalars are taken wherever Python numbers are, and give the same
result bit for bit.  A sweep's config values are checked against the model's config before
any point runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probe import Inputs, Model
from probe.analyses import attention, collapse, sweep
from probe.errors import ProbeError
from probe.requests import checks

TINY = "gpt2-tiny"
SIZES = {"sequences": 2, "tokens": 8}


def _plan(**options):
    options.setdefault("seeds", "0-1")
    return sweep.plan(Model(TINY, init="random"), Inputs(**SIZES), **options)


def _attention(**options):
    return attention.run(Model(TINY, init="random"), Inputs(**SIZES), **options)


CASES = [
    (lambda: Inputs(text=5), "text"),
    (lambda: Inputs(text=["a"]), "text"),
    (lambda: Inputs(text=b"/tmp/x"), "text"),
    (lambda: Inputs(text=""), "text"),
    (lambda: Inputs(text="a\0b"), "text"),
    (lambda: Inputs(text="a" * 5000), "text"),
    (lambda: Inputs(images=3), "images"),
    (lambda: Inputs(images=["a"]), "images"),
    (lambda: Inputs(images="/no/such"), "images"),
    (lambda: Inputs(images=""), "images"),
    (lambda: Inputs(images="a" * 5000), "images"),
    (lambda: Inputs(tokens=np.float64(8.5)), "tokens"),
    (lambda: _plan(seeds=[-1, 0]), "seeds"),
    (lambda: _plan(seeds="x"), "seeds"),
    (lambda: _plan(seeds=[1.5, 2]), "seeds"),
    (lambda: _plan(seeds={}), "seeds"),
    (lambda: _plan(seeds=[]), "seeds"),
    (lambda: _plan(seeds={0, 1}), "seeds"),
    (lambda: _plan(tokens=[8, "x"], seeds=None), "tokens"),
    (lambda: _plan(steps=[1], seeds=None), "steps"),
    (lambda: _plan(steps=5, seeds=None), "steps"),
    (lambda: _plan(steps="x", seeds=None), "steps"),
    (lambda: _plan(steps=[(1,)], seeds=None), "steps"),
    (lambda: _plan(steps=[], seeds=None), "steps"),
    (lambda: _plan(steps=[("a", "/x"), ("b", "/y")], seeds=None), "steps"),
    (lambda: _plan(steps=[(1.5, "/x"), (2, "/y")], seeds=None), "steps"),
    (lambda: _plan(steps=[(-1, "/x"), (2, "/y")], seeds=None), "steps"),
    (lambda: _plan(steps=[(True, "/x"), (2, "/y")], seeds=None), "steps"),
    (lambda: _plan(steps=[(1, None), (2, None)], seeds=None), "steps"),
    (lambda: _plan(max_points=0), "max_points"),
    (lambda: _plan(max_points="x"), "max_points"),
    (lambda: _plan(max_points=None), "max_points"),
    (lambda: _plan(max_points=2.5), "max_points"),
    (lambda: _plan(max_points=True), "max_points"),
    (lambda: _plan(epsilon="x"), "epsilon"),
    (lambda: _plan(epsilon=2), "epsilon"),
    (lambda: _plan(epsilon=float("nan")), "epsilon"),
    (lambda: _attention(epsilon="x"), "epsilon"),
    (lambda: _attention(epsilon=None), "epsilon"),
    (lambda: _attention(epsilon=np.float64(1.5)), "epsilon"),
    (lambda: _plan(config={"n_layer": []}), "config"),
    (lambda: _plan(config=[1]), "config"),
    (lambda: _plan(config="n_layer=2,3"), "config"),
    (lambda: _plan(config={1: [1, 2]}), "config"),
    (lambda: _plan(config={"n_layer": {}}), "config"),
    (lambda: _plan(config={"n_layer": [2, None]}), "config"),
    (lambda: _plan(revisions=5, seeds=None), "revisions"),
    (lambda: _plan(branch_scale={1: 2}, seeds=None), "branch_scale"),
]


@pytest.mark.parametrize(("call", "name"), CASES)
def test_a_bad_value_is_one_probe_error_line_naming_it(call, name):
    with pytest.raises(ProbeError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and f"`{name}`" in message, message


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"n_layer": "x"}, "n_layer=x"),
        ({"n_layer": [2, 0]}, "n_layer=0"),
        ({"n_layer": [2, -1]}, "n_layer=-1"),
        ({"n_layer": [2, 1.5]}, "n_layer=1.5"),
        ({"n_head": [4, 3]}, "n_head=3"),
        ({"no_such_field": [1, 2]}, "no_such_field"),
        ({"vocab_size": [100, 0]}, "vocab_size=0"),  # random ids from no vocabulary
    ],
)
def test_a_config_value_no_model_takes_is_refused_before_any_point(
    config, named, monkeypatch, tmp_path
):
    ran = []
    monkeypatch.setattr(sweep, "run_point", lambda *args, **kw: ran.append(args))
    with pytest.raises(ProbeError, match=named) as caught:
        sweep.run(Model(TINY, init="random"), Inputs(**SIZES), config=config, seeds="0-1",
                  store=tmp_path / "points")  # fmt: skip
    assert "\n" not in str(caught.value) and str(caught.value).startswith("point ")
    assert not ran and not (tmp_path / "points").exists()


def test_numpy_scalars_are_taken_as_the_numbers_they_hold():
    assert Inputs(sequences=np.int64(2), tokens=np.int32(8), batch_size=np.int64(1)) == Inputs(
        sequences=2, tokens=8, batch_size=1
    )
    assert Model(TINY, init="random", seed=np.int64(3)).seed == 3
    plan = _plan(seeds=[np.int64(0), np.int64(1)], max_points=np.int64(2),
                 epsilon=np.float64(0.3))  # fmt: skip
    same = _plan(seeds=[0, 1], max_points=2, epsilon=0.3)
    assert plan.fixed == same.fixed and plan.settings_id == same.settings_id
    assert [p.values for p in plan.points] == [p.values for p in same.points]
    assert all(type(v) is int for p in plan.points for v in p.values)
    config = _plan(config={"n_layer": np.arange(1, 3)}, seeds=None)
    assert config.settings_id == _plan(config={"n_layer": [1, 2]}, seeds=None).settings_id
    scales = _plan(branch_scale=[np.float32(0.5), np.int64(1)], seeds=None)
    assert scales.settings_id == _plan(branch_scale=[0.5, 1], seeds=None).settings_id
    assert _plan(seeds=np.arange(2)).settings_id == same.settings_id


def test_numpy_scalars_give_the_same_results_bit_for_bit():
    torch.set_num_threads(1)
    for name in ("sink_rate", "sink_score"):
        ours = _attention(epsilon=np.float64(0.25))[name].values
        np.testing.assert_array_equal(ours, _attention(epsilon=0.25)[name].values)
    numpy_run = collapse.run(
        Model(TINY, init="random", seed=np.int64(1), config={"n_layer": np.int64(2)}),
        Inputs(sequences=np.int64(2), tokens=np.int64(8)),
        variants="SAN",
        branch_scale=np.float64(0.5),
    )
    plain_run = collapse.run(
        Model(TINY, init="random", seed=1, config={"n_layer": 2}),
        Inputs(**SIZES),
        variants="SAN",
        branch_scale=0.5,
    )
    np.testing.assert_array_equal(
        numpy_run["relative_residual"].values, plain_run["relative_residual"].values
    )
    assert numpy_run.attrs["request"] == plain_run.attrs["request"]  # the same request, as data


# --- properties ------------------------------------------------------------------------------

_NUMPY_INTS = st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32])


@settings(max_examples=60, deadline=None)
@given(kind=_NUMPY_INTS, value=st.integers(0, 127))
def test_a_numpy_integer_is_checked_as_its_int(kind, value):
    number = kind(value)
    assert checks.integer("`x`", number, 0) == value
    assert type(checks.integer("`x`", number, 0)) is int
    if value < 2:
        with pytest.raises(ProbeError, match="`x`"):
            checks.integer("`x`", number, 2)


@settings(max_examples=60, deadline=None)
@given(value=st.floats(allow_nan=True, allow_infinity=True, width=32))
def test_epsilon_takes_numpy_floats_as_python_floats(value):
    from probe.measures.attention_stats import check_epsilon

    for number in (np.float32(value), np.float64(value)):
        if 0 < float(number) < 1:
            assert check_epsilon(number) == float(number)
        else:
            with pytest.raises(ProbeError, match="`epsilon`"):
                check_epsilon(number)


_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer()),
    st.text(max_size=8).filter(lambda t: not t.strip().lstrip("+").isdigit()),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.integers(max_value=0),
)


@settings(max_examples=80, deadline=None)
@given(value=_JUNK)
def test_max_points_refuses_anything_but_a_whole_number_of_at_least_one(value):
    with pytest.raises(ProbeError) as caught:
        sweep.plan(TINY, init="random", seeds="0-1", max_points=value)
    assert "`max_points`" in str(caught.value) and "\n" not in str(caught.value)


@settings(max_examples=80, deadline=None)
@given(value=st.one_of(st.integers(), st.floats(), st.none(), st.binary(max_size=4),
                       st.lists(st.text(max_size=3), max_size=2)))  # fmt: skip
def test_a_path_that_is_no_text_is_refused_naming_its_parameter(value):
    for name in ("text", "images"):
        with pytest.raises(ProbeError, match=f"`{name}`") if value is not None else _nothing():
            Inputs(**{name: value})


def _nothing():
    import contextlib

    return contextlib.nullcontext()


# --- entries that took a value a user means, or raised raw ------------------------------


def test_ids_as_a_numpy_array_or_lists_are_the_tensor_they_hold():
    import numpy as np

    from probe.analyses import collapse

    array = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
    got = collapse.run(
        "gpt2-tiny", Inputs(ids=array), init="random", variants="SAN",
        metrics="relative_residual",
    )  # fmt: skip
    want = collapse.run(
        "gpt2-tiny", Inputs(ids=torch.from_numpy(array)), init="random", variants="SAN",
        metrics="relative_residual",
    )  # fmt: skip
    np.testing.assert_array_equal(got.relative_residual.values, want.relative_residual.values)
    assert Inputs(ids=[[1, 2], [3, 4]]).ids.dtype == torch.int64


@pytest.mark.parametrize(
    "ids",
    [np.array([["a", "b"]]), [[1, 2], [3]], "1 2 3", np.array([[True, False]]), object()],
    ids=["text array", "ragged", "str", "bool", "object"],
)
def test_ids_that_hold_no_numbers_are_one_line(ids):
    with pytest.raises(ProbeError, match="`ids` must be a tensor") as caught:
        Inputs(ids=ids)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("store", ["a file", 3])
def test_a_sweep_store_that_is_no_folder_is_one_line_before_any_point(store, tmp_path):
    from probe.analyses import sweep

    if store == "a file":
        store = tmp_path / "store"
        store.write_text("")
    with pytest.raises(ProbeError, match="`store`"):
        sweep.run("gpt2-tiny", init="random", seeds="0,1", sequences=2, tokens=8,
                  variants="SAN", attention=False, store=store)  # fmt: skip
