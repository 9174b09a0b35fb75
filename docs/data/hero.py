"""The picture at the top of the README and the home page: the report of the first run.

    python docs/data/hero.py [FOLDER]

Takes a 1400 x 900 screenshot, with headless Chromium, of the HTML report that
``probe collapse minilm --init pretrained --out FOLDER`` wrote (default ``probe-reports``;
``make demo`` and ``make docs-data`` make it), and writes it to ``docs/report.png``.  The
report is opened from its file, as a user opens it; it fetches nothing.  Needs
``chromium`` (or ``chromium-browser``, ``google-chrome``) on the PATH: ``make browser``
installs it where it can.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from first_run import first_run  # noqa: E402  (sibling scripts)

PICTURE = HERE.parent / "report.png"
SIZE = (1400, 900)
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit(f"no headless browser: none of {', '.join(BROWSERS)} is on the PATH")


def screenshot(page: Path, out: Path, size: tuple[int, int] = SIZE) -> None:
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [
                browser(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--no-first-run",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                f"--screenshot={out}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"the screenshot failed ({done.returncode}):\n{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=Path("probe-reports"))
    parser.add_argument("--out", type=Path, default=PICTURE)
    args = parser.parse_args()
    report = first_run(args.folder).with_suffix(".html")
    if not report.is_file():
        raise SystemExit(f"no report beside the result: {report}")
    screenshot(report, args.out)
    print(f"{args.out}: {report}")


if __name__ == "__main__":
    main()
