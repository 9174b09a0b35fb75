"""``cli.options.shared_options``: a command takes the shared options it names, at the
defaults it sets, as one ``Shared`` value, and ``--help`` lists them after its own."""

from __future__ import annotations

import inspect
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from cli.console import settings
from cli.domains import Count, option
from cli.options import SHARED, Shared, shared_options
from probe.errors import ProbeError

runner = CliRunner()


def _app(seen: list):
    app = typer.Typer()

    @app.command()
    @shared_options("device", "quiet", tokens=8, dtype="float64")
    def demo(
        width: Annotated[int, option("--width", domain=Count(1), help="Its own.")] = 3,
        *,
        shared: Shared,
    ) -> None:
        """A command with one option of its own."""
        seen.append((width, shared, settings["quiet"]))

    return app, demo


def test_a_command_gets_the_options_it_names_at_its_defaults():
    seen: list = []
    app, _ = _app(seen)
    result = runner.invoke(app, ["--width", "5", "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    ((width, shared, quiet),) = seen
    assert width == 5 and quiet is True  # --quiet applies before the command runs
    # Given, the command's defaults, and Shared's own for what it does not take.
    assert shared == Shared(device="cpu", tokens=8, dtype="float64", quiet=True)
    assert (shared.seed, shared.init, shared.device_map, shared.remote) == (0, "both", None, False)


def test_an_option_a_command_does_not_take_is_refused():
    app, _ = _app([])
    result = runner.invoke(app, ["--seed", "1"])
    assert result.exit_code == 2 and "No such option: --seed" in result.output


def test_the_signature_lists_own_options_then_shared_ones_in_their_order():
    _, demo = _app([])
    params = list(inspect.signature(demo).parameters)
    assert params == ["width", "tokens", "device", "dtype", "quiet"]
    assert [name for name in SHARED if name in params] == params[1:]
    assert SHARED[0] == "init" and SHARED[-2:] == ("quiet", "out_dir")


def test_a_name_that_is_no_shared_option_fails_at_import():
    with pytest.raises(TypeError, match="no shared option sequences"):
        shared_options("sequences")


def test_the_request_reads_max_memory_only_with_a_device_map_and_sequences_as_a_number(
    tmp_path,
):
    (model,) = Shared(device_map="auto", max_memory="0=2GiB,cpu=3GiB").models(["gpt2"])
    assert model.max_memory == {0: "2GiB", "cpu": "3GiB"}
    with pytest.raises(ProbeError, match="`max_memory` and `offload_folder` go with"):
        Shared(max_memory="0=2GiB").models(["gpt2"])
    (tmp_path / "a.txt").write_text("some text " * 50, encoding="utf-8")
    inputs = Shared(text=tmp_path / "a.txt", tokens=16, batch_size=4).inputs("all")
    assert (inputs.sequences, inputs.tokens, inputs.batch_size) == ("all", 16, 4)
    assert Shared().inputs("7").sequences == 7
