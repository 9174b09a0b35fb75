"""A forward pass that overflows stops every analysis with one line (probe.measures.overflow).

The line names the model, its init (and variant), the layer and the dtype, and advises what
fits the run's dtype: a wider one where there is one, a smaller branch scale where one is
set.  It is raised before any statistic sees a NaN or inf, exit code 2 through the CLI,
and nothing is written.  Tiny runs: the bundled gpt2-tiny and fastformer-tiny, 2 x 16
tokens.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import probe
from cli.app import app
from probe.errors import ProbeError
from probe.measures.overflow import check_finite, overflow_advice

runner = CliRunner()
SMALLER_INIT = "a smaller initializer_range through `config`"
SMALL = {"sequences": 2, "tokens": 16}
SMALL_ARGS = ["--sequences", "2", "--tokens", "16"]
#: The fastformer-tiny's float16 forward overflows at random init with such weights.
FASTFORMER_F16 = {"init": "random", "dtype": "float16", "config": {"initializer_range": 1000}}
#: gpt2-tiny's float16 attention overflows at layer 1 with such weights, while the
#: self-test's short input still passes (at 6 and more it is refused there first).
GPT2_F16 = ["--init", "random", "--dtype", "float16", "--set", "initializer_range=5.5"]


def refused(tmp_path, *args) -> str:
    """``probe ARGS --out OUT --quiet``: exit 2, one ``probe: error:`` line, nothing in OUT."""
    out = tmp_path / "out"
    args = [*map(str, args), "--out", str(out), "--quiet"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("probe: error: "), result.stderr
    assert "Traceback" not in result.output
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())
    return lines[0].removeprefix("probe: error: ")


@pytest.mark.parametrize(
    ("dtype", "scaled", "advice"),
    [
        (torch.float16, False, "use `dtype` float32 or float64"),
        (torch.float16, True, "use `dtype` float32 or float64, or a smaller `branch_scale`"),
        (torch.bfloat16, False, "use `dtype` float64"),  # bfloat16's range is float32's
        (torch.float32, False, "use `dtype` float64"),
        (torch.float32, True, "use `dtype` float64, or a smaller `branch_scale`"),
        (torch.float64, True, "use a smaller `branch_scale`"),
        (torch.float64, False, f"use smaller weights ({SMALLER_INIT})"),
    ],
)
def test_the_advice_never_names_the_dtype_that_overflowed_unless_wider(dtype, scaled, advice):
    assert overflow_advice(dtype, scaled) == advice
    if dtype in (torch.float32, torch.float64):
        assert f"`dtype` {str(dtype).removeprefix('torch.')}" not in advice


def test_the_check_looks_at_real_entries_only_and_names_what_and_where():
    probs = torch.full((2, 3, 4, 4), 0.25)
    real = torch.tensor([[True, True, True, False], [True] * 4])
    keep = real[:, None, :, None] & real[:, None, None, :]
    probs[0, 1, 3, 0] = float("nan")  # a padding row may hold anything
    check_finite(probs, keep, 2)
    probs[1, 2, 0, 3] = float("inf")
    with pytest.raises(ProbeError) as caught:
        check_finite(probs, keep, 2, "m (random)", "attention probabilities", scaled=True)
    assert str(caught.value) == (
        "m (random): layer 2's attention probabilities hold NaN or inf: the forward pass "
        "overflowed in float32; use `dtype` float64, or a smaller `branch_scale`"
    )


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]),
    bad=st.sampled_from([float("nan"), float("inf"), -float("inf"), None]),
    huge=st.booleans(),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_check_refuses_exactly_a_non_finite_real_entry(dtype, bad, huge, padded, seed):
    """The check first screens by the tensor's sum: finite values whose sum overflows (huge)
    still pass, a non-finite value anywhere is found, and only a real one is refused."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, 4, generator=generator).to(dtype)
    if huge:  # every entry finite, their sum past the dtype's range
        x[:, :, 0] = torch.finfo(dtype).max
    real = torch.ones(3, 5, dtype=torch.bool)
    real[2, 3:] = False
    where = (2, 4, 1) if padded else (1, 2, 3)
    if bad is not None:
        x[where] = bad
    if bad is None or padded:
        check_finite(x, real, 1)
    else:
        with pytest.raises(ProbeError, match="layer 1's token representations hold NaN or inf"):
            check_finite(x, real, 1)


def test_attention_stops_before_any_statistic_sees_an_overflow(monkeypatch):
    from probe.analyses import attention

    seen = []

    def finite_heads(probs, *args, **kwargs):
        seen.append(bool(torch.isfinite(probs).all()))
        return head_sums(probs, *args, **kwargs)

    def finite_hidden(self, layer, x, *args):
        seen.append(bool(torch.isfinite(x).all()))
        return add_hidden(self, layer, x, *args)

    head_sums, add_hidden = attention.head_sums, attention.Totals.add_hidden
    monkeypatch.setattr(attention, "head_sums", finite_heads)
    monkeypatch.setattr(attention.Totals, "add_hidden", finite_hidden)
    with pytest.raises(ProbeError) as caught:
        probe.attention("gpt2-tiny", init="pretrained", branch_scale=1e30, **SMALL)
    assert str(caught.value) == (
        "gpt2-tiny (pretrained): layer 1's token representations hold NaN or inf: the forward "
        "pass overflowed in float32; use `dtype` float64, or a smaller `branch_scale`"
    )
    assert seen and all(seen)


def test_attention_in_float64_advises_a_smaller_branch_scale():
    with pytest.raises(ProbeError, match=r"overflowed in float64; use a smaller `branch_scale`$"):
        probe.attention(
            "gpt2-tiny", init="pretrained", dtype="float64", branch_scale=1e300, **SMALL
        )


def test_the_fastformer_attention_stops_at_its_first_overflowing_layer():
    # It has no attention spectrum: before, its massive_ratio and anisotropy came out NaN.
    with pytest.raises(ProbeError) as caught:
        probe.attention("fastformer-tiny", **FASTFORMER_F16, **SMALL)
    assert str(caught.value) == (
        "fastformer-tiny (random): layer 1's token representations hold NaN or inf: the "
        "forward pass overflowed in float16; use `dtype` float32 or float64"
    )


def test_cli_attention_overflow_is_one_line_exit_2_nothing_written(tmp_path):
    line = refused(
        tmp_path, "attention", "gpt2-tiny", "--init", "pretrained", "--branch-scale", "1e30",
        *SMALL_ARGS,
    )  # fmt: skip
    assert line == (
        "gpt2-tiny (pretrained): layer 1's token representations hold NaN or inf: the forward "
        "pass overflowed in float32; use --dtype float64, or a smaller --branch-scale"
    )


def test_cli_fastformer_attention_overflow_is_one_line_exit_2_nothing_written(tmp_path):
    line = refused(
        tmp_path, "attention", "fastformer-tiny", "--init", "random", "--dtype", "float16",
        "--set", "initializer_range=1000", *SMALL_ARGS,
    )  # fmt: skip
    assert line.startswith("fastformer-tiny (random): layer 1's token representations hold")
    assert line.endswith("overflowed in float16; use --dtype float32 or float64")


def test_cli_collapse_in_float32_advises_float64_not_float32(tmp_path):
    line = refused(
        tmp_path, "collapse", "gpt2-tiny", "--init", "pretrained", "--branch-scale", "1e30",
        *SMALL_ARGS,
    )  # fmt: skip
    assert line == (
        "gpt2-tiny (pretrained, SAN): layer 2's token representations hold NaN or inf: the "
        "forward pass overflowed in float32; use --dtype float64, or a smaller --branch-scale"
    )


@pytest.mark.parametrize(
    ("analysis", "where"),
    [(["--sample", "--samples", "4"], "(random)"), (["--decompose"], "(random, SAN+skip)")],
)
def test_cli_paths_overflow_names_the_layer_of_the_probabilities(analysis, where, tmp_path):
    line = refused(tmp_path, "paths", "gpt2-tiny", *analysis, *GPT2_F16, *SMALL_ARGS)
    assert line == (
        f"gpt2-tiny {where}: layer 1's attention probabilities hold NaN or inf: the forward "
        "pass overflowed in float16; use --dtype float32 or float64"
    )


def test_a_self_test_that_overflows_says_so_not_that_the_spec_is_wrong(tmp_path):
    # gpt2-tiny in float16 with weights this large overflows already in the load-time
    # self-test's forward: the line is the overflow's, with its advice, not a spec mismatch.
    line = refused(
        tmp_path, "collapse", "gpt2-tiny", "--init", "random", "--dtype", "float16",
        "--set", "initializer_range=1000", *SMALL_ARGS,
    )  # fmt: skip
    assert line.startswith("gpt2-tiny: the self-test's forward pass (")
    assert line.endswith(
        "holds NaN or inf: it overflowed in float16; use --dtype float32 or float64"
    )
    assert "spec does not fit" not in line


def test_probe_check_on_a_model_that_overflows_is_the_overflow_line_not_a_table(tiny_folders):
    args = ["check", tiny_folders["bert"], "--init", "random", "--tokens", "2", "--dtype",
            "float32", "--set", "initializer_range=1e30"]  # fmt: skip
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # no table of identities that never ran on finite numbers
    (line,) = result.stderr.splitlines()
    assert "hold NaN or inf: the forward pass overflowed in float32; use --dtype float64" in line
