"""File names that are not UTF-8 (Linux names are bytes): results, reports and folders
named so are written, listed, linked and rendered again like any other; a page shows each
such byte as \\xNN and links to the name's own bytes (%FF); a recorded command quotes it as
bash's $'...' so it pastes back as the same bytes."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import probe
from probe.cli.app import app
from probe.files.names import quoted, readable, shell_word

RUN = ["collapse", "gpt2-tiny", "--init", "random", "--sequences", "2", "--tokens", "8",
       "--variants", "SAN", "--quiet"]  # fmt: skip
ODD = os.fsdecode(b"x\xff\xfe")  # two bytes no UTF-8 text holds


def _run(*args):
    done = CliRunner().invoke(app, [*RUN, *args])
    assert done.exit_code == 0, done.output
    assert "Traceback" not in done.output
    return done


def test_a_result_named_so_in_out_is_listed_and_linked_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    _run("--out", str(out))
    (nc,) = out.glob("*.nc")
    for suffix in (".nc", ".html"):  # renamed, as a user might
        nc.with_suffix(suffix).rename(out / f"{ODD}{suffix}")
    _run("--out", str(out), "--seed", "3")  # rebuilds the index over both
    index = (out / "index.html").read_text(encoding="utf-8")
    assert 'href="x%FF%FE.html"' in index
    done = CliRunner().invoke(app, ["report", "build", str(out / f"{ODD}.nc")])
    assert done.exit_code == 0, done.output
    assert "damaged" not in done.output
    page = (out / f"{ODD}.html").read_text(encoding="utf-8")
    assert 'href="x%FF%FE.nc"' in page and "x\\xff\\xfe.nc" in page


def test_an_out_folder_named_so_holds_its_results_and_a_pasteable_command(tmp_path):
    out = tmp_path / ODD
    _run("--out", str(out))
    (nc,) = out.glob("*.nc")
    command = probe.open_result(nc).attrs["command"]
    assert command.endswith(" --out " + quoted(str(out)))
    words = subprocess.run(["bash", "-c", f"printf '%s' {quoted(str(out))}"],
                           capture_output=True, check=True).stdout  # fmt: skip
    assert words == os.fsencode(out)
    shutil.rmtree(out)


@settings(max_examples=25, deadline=None)
@given(st.binary(min_size=1, max_size=12).filter(lambda b: b"\x00" not in b))
def test_a_quoted_name_pastes_back_as_its_bytes(name):
    text = os.fsdecode(name)
    words = subprocess.run(["bash", "-c", f"printf '%s' {shell_word(text)}"],
                           capture_output=True, check=True).stdout  # fmt: skip
    assert words == name
    readable(text).encode("utf-8")  # always text a page or a netCDF attribute holds


@pytest.mark.parametrize("name", ["plain.nc", "with space.nc", "ünïcode.nc"])
def test_a_utf8_name_is_left_as_it_is(name):
    assert readable(name) == name


def test_an_error_about_a_name_so_shows_its_bytes(tmp_path):
    """transformers cannot read a checkpoint at such a path (safetensors wants UTF-8): one
    line, the name's bytes as \\xNN."""
    folder = tmp_path / ODD
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    done = CliRunner().invoke(app, ["collapse", str(folder), "--out", str(tmp_path / "o")])
    assert done.exit_code == 2
    (line,) = done.stderr.splitlines()
    assert "x\\xff\\xfe" in line and "\\udc" not in line
