"""docs/adding-an-analysis.md, followed: a small analysis (the mean token norm per layer)
written outside the project, in its five pieces and one declaration, runs through the
command line into a result file, its report and the folder's index, and its numbers
equal transformers' own hidden states."""

from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import probe
from probe import registry
from probe.cli.app import app

EXAMPLE = '''
"""The mean token norm per layer: the example of docs/adding-an-analysis.md."""

from pathlib import Path
from typing import Annotated

import numpy as np
import xarray as xr

from probe.analyses.preamble import begin
from probe.requests.request import provenance, record
from probe.files.results import utc_now, versions
from probe.surgery.trace import hidden_states

NAME = "mean-norm"


# 1. The measurement: the request, the models, their inputs, a Dataset.
def run(model, inputs=None, *, command=None, **flat):
    sizes = {"sequences": 2, "tokens": 8, "batch_size": 2}
    begun = begin(model, inputs, flat, sizes=sizes)
    request, given, models, encoded = begun.request, begun.given, begun.models, begun.inputs
    norms = [
        [float(x.double().norm(dim=-1).mean()) for x in hidden_states(p, encoded.input_ids)]
        for p in models
    ]
    ds = xr.Dataset(
        {
            "mean_norm": (("init", "layer"), np.array(norms)),
            "input_ids": (("sequence", "token"), encoded.input_ids.numpy()),
        },
        coords={"init": [p.init for p in models], "layer": np.arange(len(norms[0]))},
    )
    sizes = {"sequences": encoded.sequences, "tokens": encoded.tokens}
    ds.attrs.update(
        analysis=NAME, **provenance(models, encoded), **versions(), created=utc_now(),
        command=command or "", request=record(NAME, request, given, {}, **sizes),
    )
    return ds


# 2. The report: a pure function of the Dataset.
def render(ds, result_file=None):
    from probe.reports.page import esc, page
    from probe.reports.reproduce import command_line

    rows = "".join(
        f"<tr><td>{int(layer)}</td><td>{float(v):.4g}</td></tr>"
        for layer, v in zip(ds.layer.values, ds.mean_norm.isel(init=0).values)
    )
    body = f"<pre><code>{esc(command_line(ds.attrs))}</code></pre><table>{rows}</table>"
    meta = {"model": ds.attrs["model"], "analysis": NAME, "result": result_file or "x.nc",
            "created": ds.attrs["created"], "id": "example"}
    return page(f"{ds.attrs['model']} · mean token norm", body, meta)


# 3. The index line.
def headline(ds):
    last = ds.mean_norm.isel(layer=-1)
    return {"lines": [["", [[str(i), f"{float(last.sel(init=i)):.4g}"] for i in ds.init.values]]],
            "note": f"{ds.sizes['layer'] - 1} layers"}


# 4. The command.
from probe.cli.console import command_line, named
from probe.cli.domains import ModelName, argument
from probe.cli.options import Shared, shared_options
from probe.cli.output import check_out_dir, write_index, write_pair


@shared_options("init", "seed", "tokens", "out_dir")
def command(
    model: Annotated[str, argument("MODEL", ModelName(), help="A model.")], *, shared: Shared
) -> None:
    """The mean token norm per layer."""
    (request,) = shared.models([model])
    check_out_dir(shared.out_dir)
    ds = run(request, shared.inputs(2), command=command_line())
    name = f"{NAME}-{Path(model).name}"
    nc, html = write_pair(ds, shared.out_dir, name, render(ds, f"{name}.nc"))
    named("result", nc)
    named("report", html)
    named("index", write_index(shared.out_dir))
'''


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The example's module, declared (5.) and its command listed, for this test only."""
    (tmp_path / "mean_norm_example.py").write_text(textwrap.dedent(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("mean_norm_example")
    declared = registry.Analysis(
        "mean-norm",
        {"mean_norm": ("init", "layer")},
        "mean_norm_example:run",
        "mean_norm_example:command",
        "mean_norm_example:render",
        "mean_norm_example:headline",
        ("Mean token norm", "last layer", "The largest mean token norm at the last layer."),
    )
    monkeypatch.setattr(registry, "ANALYSES", (*registry.ANALYSES, declared))
    app.command("mean-norm")(module.command)
    yield module
    app.registered_commands.pop()
    sys.modules.pop("mean_norm_example", None)


def test_a_new_analysis_runs_through_the_command_line_result_report_and_index(
    example, tiny_folders, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    folder = tiny_folders["bert"]
    done = CliRunner().invoke(app, ["mean-norm", folder, "--init", "pretrained", "--out", "r"])
    assert done.exit_code == 0, done.output
    out = tmp_path / "r"
    (nc,) = out.glob("mean-norm-*.nc")
    ds = probe.open_result(nc)  # checked against its declared variables
    assert ds.attrs["command"].startswith("probe mean-norm ")
    assert "mean token norm" in nc.with_suffix(".html").read_text()
    index = (out / "index.html").read_text()
    assert "Mean token norm" in index and nc.with_suffix(".html").name in index
    # The numbers, against transformers' own hidden states of the same token ids.
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        states = model(torch.as_tensor(ds.input_ids.values), output_hidden_states=True)
    want = [float(x.double().norm(dim=-1).mean()) for x in states.hidden_states]
    # float32 forwards, float64 norms of the same tensors: equal to rounding only.
    np.testing.assert_allclose(ds.mean_norm.sel(init="pretrained").values, want, rtol=1e-6)
    # A result missing its declared variable is refused as damage.
    with pytest.raises(probe.ProbeError, match="mean_norm"):
        from probe.files.results import check_schema

        check_schema(ds.drop_vars("mean_norm"))


def test_a_library_call_renders_its_command_from_the_request(example, tiny_folders):
    from probe.reports.render import render

    ds = example.run(tiny_folders["bert"], init="random", seed=1)
    assert ds.attrs["command"] == ""
    page = render(ds, "x.nc")  # dispatched to the declared report
    assert f"probe mean-norm {tiny_folders['bert']} --init random --seed 1" in page
