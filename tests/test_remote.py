"""Remote models through nnsight's remote backend (NDIF), tested with its local simulation.

``remote="local"`` serializes each trace as the remote backend would, with modules that are
not installed on a server hidden, deserializes it and runs it here: the request is built
from the same walker and reductions as a local run, so the numbers must be identical.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import probe
from probe.analyses import collapse
from probe.errors import ProbeError

METRICS = ("relative_residual", "mu", "effective_rank", "stable_rank", "cosine_similarity")
# One batch, two variants: each simulated request re-imports what it ships (seconds each).
OPTIONS = {
    "init": "pretrained",
    "sequences": 2,
    "tokens": 16,
    "batch_size": 2,
    "variants": "SAN,transformer",
    "command": "c",
}


#: nnsight's simulation re-imports the modules a request ships (probe, matplotlib's
#: kiwisolver, ...), which leaves two copies of their classes in the process: every later
#: figure then fails.  So these tests run in a child pytest process of their own, started
#: by ``test_remote_tests_in_their_own_process``.
CHILD = os.environ.get("PROBE_REMOTE_CHILD") == "1"
child_only = pytest.mark.skipif(not CHILD, reason="runs in its own process (see below)")


@pytest.fixture(scope="module")
def tiny_masked_lm(tmp_path_factory, minilm_tokenizer) -> str:
    """A tiny BertForMaskedLM over the real bert-base-uncased vocabulary, with its tokenizer."""
    from transformers import BertConfig, BertForMaskedLM

    folder = tmp_path_factory.mktemp("mlm") / "tiny-bert-mlm"
    config = BertConfig(
        vocab_size=minilm_tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    torch.manual_seed(5)
    BertForMaskedLM(config).save_pretrained(folder)
    minilm_tokenizer.save_pretrained(folder)
    return str(folder)


@child_only
@pytest.mark.parametrize("model", ["gpt2-tiny", "masked"])
def test_local_simulation_of_the_remote_path_gives_the_local_numbers(
    model, tiny_masked_lm, monkeypatch
):
    from nnsight.intervention.backends import local

    name = tiny_masked_lm if model == "masked" else model  # gpt2-tiny: probe's shipped LM
    requests = []
    call = local.LocalSimulationBackend.__call__
    monkeypatch.setattr(
        local.LocalSimulationBackend,
        "__call__",
        lambda self, tracer: (requests.append(1), call(self, tracer))[1],
    )
    here = collapse.run(name, **OPTIONS)
    assert not requests
    there = collapse.run(name, remote="local", **OPTIONS)
    # every variant's trace of the one batch, and the theory panel's SAN+MLP and SAN+skip
    # traces, went the remote way (its SAN residuals come from the run's own SAN trace)
    assert len(requests) == 2 + 2
    for metric in METRICS:
        xr.testing.assert_identical(here[metric], there[metric])  # identical, not close
    assert "local simulation of NDIF" in there.attrs["weights"]


@child_only
def test_remote_takes_pretrained_language_models_only(tiny_folders):
    with pytest.raises(ProbeError, match="pretrained weights only"):
        probe.load("gpt2-tiny", init="random", remote="local")
    with pytest.raises(ProbeError, match="not a causal or masked language model"):
        probe.load(tiny_folders["bert"], init="pretrained", remote="local")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--init", "pretrained"], "--remote needs the network"),  # the tests run offline
        ([], "--remote runs pretrained weights only; add --init pretrained"),
        (["--init", "pretrained", "--device-map", "auto"], "drop --device and --device-map"),
    ],
)
@child_only
def test_cli_remote_without_network_says_so_in_one_line(tmp_path, extra, message):
    from probe.cli.app import app

    result = CliRunner().invoke(
        app, ["collapse", "gpt2-tiny", "--remote", *extra, "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


@pytest.mark.skipif(CHILD, reason="the parent of the child run")
def test_remote_tests_in_their_own_process():
    """Every test above, in a fresh pytest process (they must all pass there)."""
    env = {**os.environ, "PROBE_REMOTE_CHILD": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "1 skipped" in summary, summary  # skipped: this test
