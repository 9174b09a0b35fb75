"""A real headless Chromium driven over the DevTools protocol, for the browser tests.

The browser is Debian's ``chromium`` (``make test`` installs it where it can); without one
the tests are skipped.  It is driven through ``--remote-debugging-pipe``: NUL-terminated
JSON messages, commands written to the browser's fd 3 and answers read from its fd 4, so
only the standard library is needed and no port is opened.

One browser serves every page of a test (:class:`Browser`); each page opens in a fresh
tab at 1400 x 900 CSS pixels, and what a person would meet is recorded in a
:class:`PageVisit`: the screenshot, the figures' boxes, console errors and uncaught
exceptions, Content-Security-Policy violations, images that did not load, elements that
stick out of the page, and requests for anything but the page itself.
"""

from __future__ import annotations

import base64
import contextlib
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

STARTUP_TIMEOUT = 20.0  # seconds for the browser to answer its first command
COMMAND_TIMEOUT = 10.0  # seconds for any one DevTools command or awaited event
VIEWPORT = (1400, 900)  # CSS pixels, the width a report is checked at

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


# Installed before the page's own content: records every Content-Security-Policy violation.
# Scripts the browser injects over DevTools are not subject to the page's policy.
WATCH_CSP_JS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", e =>
  window.__violations.push(`${e.effectiveDirective} blocked ${e.blockedURI.slice(0, 40)}`));
"""

# After load, with every <details> opened: what a reader could unfold must fit too.
INSPECT_JS = """
(() => {
  document.querySelectorAll("details").forEach(d => { d.open = true; });
  const width = document.documentElement.clientWidth;
  const clipped = el => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const overflow = getComputedStyle(p).overflowX;
      if (overflow === "auto" || overflow === "scroll" || overflow === "hidden") return true;
    }
    return false;
  };
  const name = el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    (el.className && typeof el.className === "string" ? "." + el.className.split(" ")[0] : "") +
    ` "${(el.textContent || "").trim().slice(0, 40)}"`;
  const outside = [];
  for (const el of document.body.querySelectorAll("*")) {
    if (el.closest("svg") && el.tagName.toLowerCase() !== "svg") continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    if ((box.right > width + 1 || box.left < -1) && !clipped(el)) {
      outside.push(`${name(el)} spans x ${Math.round(box.left)} to ${Math.round(box.right)}`);
    }
  }
  const broken = Array.from(document.images)
    .filter(img => !img.complete || img.naturalWidth === 0)
    .map(img => img.src.slice(0, 60));
  const figures = Array.from(document.querySelectorAll("svg"))
    .filter(svg => !svg.parentElement.closest("svg"))
    .map(svg => {
      const box = svg.getBoundingClientRect();
      return {label: svg.getAttribute("aria-label"), width: box.width, height: box.height};
    });
  return JSON.stringify({
    outside: outside.slice(0, 20), broken, figures, violations: window.__violations || [],
    scrollWidth: document.documentElement.scrollWidth, width,
  });
})()
"""


@dataclass
class PageVisit:
    """What a person would have seen (and what the browser logged) opening one page."""

    url: str
    screenshot: bytes
    svg_boxes: list[dict]
    errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Everything a reader would call broken, one line each (empty: the page is fine)."""
        found = [f"console: {e}" for e in self.errors]
        found += [f"CSP violation: {v}" for v in self.violations]
        found += [f"broken image: {src}" for src in self.broken_images]
        found += [f"outside the page: {o}" for o in self.outside]
        found += [f"request for something besides the page: {r}" for r in self.foreign_requests]
        small = [box for box in self.svg_boxes if box["width"] <= 50 or box["height"] <= 50]
        found += [f"figure laid out too small to see: {box}" for box in small]
        return found


class Browser:
    """One headless Chromium for several pages; use as a context manager."""

    def __init__(self, workdir: Path) -> None:
        binary = chromium()
        if binary is None:
            pytest.skip(NO_CHROMIUM)
        self._tools = DevTools(binary, workdir / "profile", workdir / "chromium.log")
        try:
            self._tools.call("Browser.getVersion", timeout=STARTUP_TIMEOUT)
        except BaseException:
            self._tools.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self._tools.close()

    def open(self, page: Path) -> PageVisit:
        """Open `page` (a local HTML file) in a new tab and record what happened."""
        browser = self._tools
        url = page.resolve().as_uri()
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                browser.call(f"{domain}.enable", session=session)
            width, height = VIEWPORT
            browser.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            browser.call(
                "Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_CSP_JS}, session=session
            )
            browser.events.clear()  # only what happens from the navigation on counts
            navigated = browser.call("Page.navigate", {"url": url}, session=session)
            assert "errorText" not in navigated, f"cannot open {url}: {navigated['errorText']}"
            browser.wait_for("Page.loadEventFired", session=session)
            shot = browser.call("Page.captureScreenshot", {"format": "png"}, session=session)
            found = browser.call(
                "Runtime.evaluate",
                {"expression": INSPECT_JS, "returnByValue": True},
                session=session,
            )["result"]["value"]
            events = [e for e in browser.events if e.get("sessionId") == session]
        finally:
            browser.call("Target.closeTarget", {"targetId": target})
        found = json.loads(found)
        result = PageVisit(
            url,
            base64.b64decode(shot["data"]),
            found["figures"],
            violations=found["violations"],
            broken_images=found["broken"],
            outside=found["outside"],
        )
        if found["scrollWidth"] > found["width"] + 1:
            result.outside.append(f"the page scrolls sideways: {found['scrollWidth']} px wide")
        for event in events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                text = " ".join(
                    str(a.get("value", a.get("description", ""))) for a in params["args"]
                )
                result.errors.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                text = details.get("exception", {}).get("description") or details.get("text")
                result.errors.append(f"uncaught exception: {text}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                result.errors.append(
                    f"{entry.get('source')}: {entry.get('text')[:200]} {entry.get('url', '')[:80]}"
                )
            elif method == "Network.requestWillBeSent":
                requested = params["request"]["url"]
                if requested != url and not requested.startswith("data:"):
                    result.foreign_requests.append(requested)
        return result


def visit(page: Path, workdir: Path) -> PageVisit:
    """Open one page in a browser of its own."""
    with Browser(workdir) as browser:
        return browser.open(page)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
