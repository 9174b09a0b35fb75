"""A generated report, opened in a real headless Chromium and checked as a person would.

The browser is Debian's ``chromium`` (``make test`` installs it where it can);
without one the test is skipped.  It is driven over the DevTools protocol
through ``--remote-debugging-pipe``: NUL-terminated JSON messages, commands
written to the browser's fd 3 and answers read from its fd 4, so only the
standard library is needed and no port is opened.

Checks: a screenshot that is not blank, every inline SVG figure laid out at a
visible size, no console error or uncaught exception, and no request for
anything but the page itself (a report must open offline, from a file).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import queue
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image

from probe.reports import render
from tests.datasets import make_collapse_dataset

STARTUP_TIMEOUT = 20.0  # seconds for the browser to answer its first command
COMMAND_TIMEOUT = 10.0  # seconds for any one DevTools command or awaited event
VIEWPORT = (1280, 900)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
    f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
]

# Top-level <svg> elements (matplotlib's figures do not nest, but be safe) with their boxes.
SVG_BOXES_JS = """
JSON.stringify(Array.from(document.querySelectorAll("svg"))
  .filter(svg => !svg.parentElement.closest("svg"))
  .map(svg => {
    const box = svg.getBoundingClientRect();
    return {label: svg.getAttribute("aria-label"), width: box.width, height: box.height};
  }))
"""


NO_CHROMIUM = (
    "no chromium or chromium-browser on PATH (apt-get install chromium, or `make browser`)"
)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """A minimal DevTools client over Chromium's --remote-debugging-pipe."""

    def __init__(self, binary: str, profile: Path, log: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # Chromium reads commands from fd 3 and writes answers to fd 4.  Every
            # other descriptor of ours is close-on-exec (PEP 446), so nothing else leaks.
            self.pid = os.posix_spawn(
                binary,
                [binary, *FLAGS, f"--user-data-dir={profile}"],
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                    (os.POSIX_SPAWN_DUP2, to_browser_r, 3),
                    (os.POSIX_SPAWN_DUP2, from_browser_w, 4),
                ],
                setsid=True,  # its own process group, so close() ends every child too
            )
        finally:
            for fd in (to_browser_r, from_browser_w, log_fd):
                os.close(fd)
        self.returncode: int | None = None
        self._messages: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0
        self.events: list[dict] = []

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._messages.put(None)  # the browser closed its end
                return
            buffer += chunk
            *complete, buffer = buffer.split(b"\0")
            for raw in complete:
                self._messages.put(json.loads(raw))

    def _get(self, deadline: float) -> dict:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no answer from Chromium in time")
        try:
            message = self._messages.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError("no answer from Chromium in time") from None
        if message is None:
            raise RuntimeError("Chromium closed the DevTools pipe (did it crash? see chromium.log)")
        return message

    def call(
        self, method: str, params: dict | None = None, session: str | None = None, timeout=None
    ) -> dict:
        """Send a command and wait for its answer; events met meanwhile go to `events`."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or COMMAND_TIMEOUT)
        while True:
            answer = self._get(deadline)
            if answer.get("id") != self._next_id:
                self.events.append(answer)
                continue
            if "error" in answer:
                raise RuntimeError(f"{method} failed: {answer['error']}")
            return answer.get("result", {})

    def wait_for(self, method: str, session: str | None = None, timeout=None) -> dict:
        """The first event `method` (already received or still to come)."""
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        deadline = time.monotonic() + (timeout or COMMAND_TIMEOUT)
        while True:
            event = self._get(deadline)
            self.events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return event

    def close(self) -> None:
        """Kill the browser's whole process group and reap it; safe to call twice."""
        with contextlib.suppress(OSError):
            os.close(self._to_browser)
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.returncode is None and time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.02)
        self._reader.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._from_browser)


@dataclass
class PageVisit:
    """What a person would have seen (and what the browser logged) opening one page."""

    url: str
    screenshot: bytes
    svg_boxes: list[dict]
    errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)


def visit(page: Path, workdir: Path) -> PageVisit:
    """Open `page` (a local HTML file) in headless Chromium and record what happened."""
    binary = chromium()
    if binary is None:
        pytest.skip(NO_CHROMIUM)
    url = page.resolve().as_uri()
    browser = DevTools(binary, workdir / "profile", workdir / "chromium.log")
    try:
        browser.call("Browser.getVersion", timeout=STARTUP_TIMEOUT)
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable", session=session)
        width, height = VIEWPORT
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        browser.events.clear()  # only what happens from the navigation on counts
        navigated = browser.call("Page.navigate", {"url": url}, session=session)
        assert "errorText" not in navigated, f"cannot open {url}: {navigated['errorText']}"
        browser.wait_for("Page.loadEventFired", session=session)
        boxes = browser.call(
            "Runtime.evaluate", {"expression": SVG_BOXES_JS, "returnByValue": True}, session=session
        )["result"]["value"]
        shot = browser.call("Page.captureScreenshot", {"format": "png"}, session=session)
        events = [e for e in browser.events if e.get("sessionId") == session]
    finally:
        browser.close()

    result = PageVisit(url, base64.b64decode(shot["data"]), json.loads(boxes))
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            result.errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            result.errors.append(f"uncaught exception: {text}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            result.errors.append(
                f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}"
            )
        elif method == "Network.requestWillBeSent":
            requested = params["request"]["url"]
            if requested != url and not requested.startswith("data:"):
                result.foreign_requests.append(requested)
    return result


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_in_a_real_browser(tmp_path):
    if chromium() is None:
        pytest.skip(NO_CHROMIUM)
    page = tmp_path / "report.html"
    html = render(make_collapse_dataset(), result_file="x.nc")
    page.write_text(html, encoding="utf-8")

    seen = visit(page, tmp_path)

    shot = tmp_path / "report.png"
    shot.write_bytes(seen.screenshot)
    assert png_size(seen.screenshot) == VIEWPORT
    with Image.open(io.BytesIO(seen.screenshot)) as image:
        grey = image.convert("L")
        low, high = grey.getextrema()
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert high - low > 100, f"screenshot {shot} is nearly uniform"
    assert colours is None or len(colours) > 16, f"screenshot {shot} has almost no content"

    assert seen.svg_boxes, "the report shows no inline SVG figure"
    assert len(seen.svg_boxes) == html.count("<svg "), "the browser dropped an SVG figure"
    small = [box for box in seen.svg_boxes if box["width"] <= 50 or box["height"] <= 50]
    assert not small, f"SVG figures laid out too small to see: {small}"

    assert not seen.errors, "console errors while opening the report:\n" + "\n".join(seen.errors)
    assert not seen.foreign_requests, (
        f"the report asked for something besides its own file: {seen.foreign_requests}"
    )
