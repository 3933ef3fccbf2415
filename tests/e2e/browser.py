"""Headless Chromium driven over the DevTools protocol on a pipe (no websocket client needed):
open a page, read what it shows after its scripts ran, type into it, take screenshots.

`--remote-debugging-pipe` makes Chromium read commands from fd 3 and write answers to fd 4, each
a JSON message ending in NUL; bash's `exec` puts our pipe ends on those numbers.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        assert CHROMIUM is not None
        to_chromium, self._commands = os.pipe()
        self._answers, from_chromium = os.pipe()
        # Above 4, so that putting one end on fd 3 can never overwrite the other before it moves.
        to_chromium, from_chromium = (_moved_above_4(fd) for fd in (to_chromium, from_chromium))
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
        flags += ["--disable-component-update", "--disable-sync", "--remote-debugging-pipe"]
        flags += [f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        self.process = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_chromium} 4>&{from_chromium}', CHROMIUM, *flags],
            pass_fds=(to_chromium, from_chromium),
            stdout=subprocess.DEVNULL,
            stderr=(profile.parent / "chromium.err").open("wb"),  # why it died, if it does
            start_new_session=True,
        )
        os.close(to_chromium)
        os.close(from_chromium)
        self._next_id = 0
        self._buffer = b""
        targets = self._call("Target.getTargets")["targetInfos"]
        page = next(t["targetId"] for t in targets if t["type"] == "page")
        self._session = self._call("Target.attachToTarget", targetId=page, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the page."""
        return self._call(method, session=self._session, **params)

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read(timeout=30.0)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._answers], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)[
            "result"
        ].get("value")

    def text(self, selector: str = "body") -> str:
        """What the page shows in `selector` (its rendered text, after its scripts ran)."""
        return self.evaluate(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''")

    def wait_for_text(self, selector: str, *needles: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        shown = ""
        while time.monotonic() < deadline:
            shown = self.text(selector)
            if all(needle in shown for needle in needles):
                return shown
            time.sleep(0.2)
        raise TimeoutError(f"{selector} never showed {needles}; it shows:\n{shown}")

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(png)
        return png

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)
        os.close(self._commands)
        os.close(self._answers)


def _moved_above_4(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 5)
    os.close(fd)
    return moved
