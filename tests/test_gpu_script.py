"""benchmarks/gpu.sh: its wheel list matches the tested versions, its arguments are checked.

The script itself runs on a GPU machine (and, at tiny sizes, with ``--device cpu``); these
checks are what can go wrong here without running it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    return pins


def test_the_carried_wheels_are_the_versions_ci_tests():
    carried = _pins(ROOT / "benchmarks" / "gpu-wheels.txt")
    tested = _pins(ROOT / "constraints.txt")
    differ = {k: (v, tested[k]) for k, v in carried.items() if k in tested and tested[k] != v}
    assert not differ, f"gpu-wheels.txt and constraints.txt disagree: {differ}"
    # the libraries probe's code reads closely travel at the tested version
    assert {"nnsight", "transformers", "xarray", "h5netcdf", "typer"} <= carried.keys()


def test_the_script_parses_and_refuses_bad_arguments_in_one_line(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    shown = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--fetch-wheels" in shown.stdout
    for args, message in (
        (["--device", "tpu"], "--device takes cuda or cpu"),
        (["--frobnicate"], "unknown argument '--frobnicate'"),
    ):
        done = subprocess.run(
            ["bash", str(SCRIPT), *args, "--out", str(tmp_path)], capture_output=True, text=True
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [done.stderr.strip()] and message in done.stderr
        assert not any(tmp_path.iterdir())  # refused before it wrote anything
