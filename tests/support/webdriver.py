"""A headless Chromium driven over the W3C WebDriver protocol (Debian's ``chromium`` and
``chromium-driver``), through httpx: what a browser test needs, without Selenium."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx

from inferq.embedded import free_port

T = TypeVar("T")
#: The W3C key of an element reference in WebDriver replies.
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    for name, package in (("chromium", "chromium"), ("chromedriver", "chromium-driver")):
        if shutil.which(name) is None:
            return (f"{name} is not installed (apt-get install -y chromium chromium-driver; "
                    f"Debian package {package})")
    return None


class Browser:
    def __init__(self, base: str, session: str, http: httpx.Client) -> None:
        self._base = f"{base}/session/{session}"
        self._http = http

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        reply = self._http.request(method, f"{self._base}{path}", json=body)
        value = reply.json()["value"]
        if reply.status_code != 200:
            raise AssertionError(f"webdriver {method} {path}: {value}")
        return value

    def get(self, url: str) -> None:
        self._call("POST", "/url", {"url": url})

    def find_all(self, css: str) -> list[str]:
        found = self._call("POST", "/elements", {"using": "css selector", "value": css})
        return [e[ELEMENT] for e in found]

    def find(self, css: str) -> str:
        (element,) = self.find_all(css)
        return element

    def text(self, css: str) -> str | None:
        """The text of the one element ``css`` matches, or None when it matches none (a
        redraw may replace it between the find and the read: None then, too)."""
        found = self.find_all(css)
        if len(found) != 1:
            return None
        reply = self._http.get(f"{self._base}/element/{found[0]}/text")
        return str(reply.json()["value"]) if reply.status_code == 200 else None

    def type(self, css: str, text: str) -> None:
        self._call("POST", f"/element/{self.find(css)}/value", {"text": text})

    def click(self, css: str) -> None:
        self._call("POST", f"/element/{self.find(css)}/click", {})

    def script(self, source: str) -> Any:
        return self._call("POST", "/execute/sync", {"script": source, "args": []})

    def wait(self, check: Callable[[], T | None], what: str, timeout: float = 15) -> T:
        """Poll the page until ``check`` returns something truthy: a browser gives a test no
        event to await, only its DOM to read."""
        end = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > end:
                raise AssertionError(f"the page never showed {what}")
            time.sleep(0.1)


@contextmanager
def chromium() -> Iterator[Browser]:
    port = free_port()
    driver = subprocess.Popen([shutil.which("chromedriver") or "chromedriver", f"--port={port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=60) as http:
            for _ in range(200):
                try:
                    if http.get(f"{base}/status").json()["value"]["ready"]:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            options = {"binary": shutil.which("chromium"),
                       "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                                "--disable-dev-shm-usage", "--window-size=1400,1000"]}
            reply = http.post(f"{base}/session", json={"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": options}}})
            session = reply.json()["value"]["sessionId"]
            try:
                yield Browser(base, session, http)
            finally:
                http.delete(f"{base}/session/{session}")
    finally:
        driver.terminate()
        driver.wait(10)
