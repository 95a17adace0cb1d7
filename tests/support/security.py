"""Connection-security test support: the secrets (so that logs can be searched for them), an
in-process round trip, the CLI as a subprocess, and certificates from ``trustme``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

import inferq
from inferq.connection import ConnectionSettings
from inferq.embedded import free_port
from inferq.worker.core.config import WorkerConfig
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.servers import SecureServer

#: Reserved URL characters on purpose: the URL must carry it percent-encoded.
PASSWORD = "s3cr@t:/p?w#d"
QUOTED = quote(PASSWORD, safe="")
ADMIN_PASSWORD = "admin-pw-0f3c"
ACL_USER, ACL_PASSWORD = "inferq-app", "acl-pw-77d1"
TLS_ENV = ("INFERQ_TLS_CA", "INFERQ_TLS_CERT", "INFERQ_TLS_KEY", "INFERQ_REDIS_URL")


def secrets_in(text: str) -> list[str]:
    return [s for s in (PASSWORD, QUOTED, ADMIN_PASSWORD, ACL_PASSWORD) if s in text]


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in TLS_ENV}
    return subprocess.run([sys.executable, "-m", "inferq", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, env={**environ, **(env or {})})


async def round_trip(conn: ConnectionSettings | str, worker_config: WorkerConfig,
                     *, prompt: str = "hello") -> None:
    """An in-process worker serves one request from an ``AsyncClient`` and one from a
    ``Client``, both connected with ``conn``."""
    worker = WindowWorker(worker_config, EchoModel())
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    model = worker_config.model_name
    try:
        async with inferq.AsyncClient(conn) as aclient:
            handle = await aclient.enqueue(f"async {prompt}", model=model)
            result = asyncio.ensure_future(handle.result(timeout=20))
            await asyncio.wait({task, result}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                result.cancel()
                task.result()  # raises the worker's error
                raise AssertionError("the worker stopped early")
            assert (await result).output == f"async {prompt}"

        def sync() -> Any:
            with inferq.Client(conn) as client:
                return client.enqueue(f"sync {prompt}", model=model).result(timeout=20).output

        assert await asyncio.to_thread(sync) == f"sync {prompt}"
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, timeout=30)


def worker_config(url: str | ConnectionSettings, model: str, **kw: Any) -> WorkerConfig:
    conn = url if isinstance(url, ConnectionSettings) else ConnectionSettings(url)
    return WorkerConfig(connection=conn, model_name=model, model_spec="builtin:echo",
                        max_wait_ms=2, lease_ms=5_000, worker_id=f"w-{model}", **kw)


def admin_client(server: SecureServer) -> redis.Redis:
    return redis.Redis(port=server.port, password=ADMIN_PASSWORD)


@dataclass(frozen=True)
class Certs:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_combined: Path


def make_certs(d: Path, trustme: Any) -> Certs:
    """A CA with a server (``localhost``) and a client certificate, and another CA, in ``d``."""
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost")  # not 127.0.0.1: the host name check is tested
    client = ca.issue_cert("inferq-client@example.org")
    certs = Certs(ca=d / "ca.pem", other_ca=d / "other-ca.pem", server_cert=d / "server.pem",
                  server_key=d / "server.key", client_cert=d / "client.pem",
                  client_key=d / "client.key", client_combined=d / "client-combined.pem")
    ca.cert_pem.write_to_path(str(certs.ca))
    other.cert_pem.write_to_path(str(certs.other_ca))
    server.private_key_pem.write_to_path(str(certs.server_key))
    for i, blob in enumerate(server.cert_chain_pems):
        blob.write_to_path(str(certs.server_cert), append=i > 0)
    client.private_key_pem.write_to_path(str(certs.client_key))
    for i, blob in enumerate(client.cert_chain_pems):
        blob.write_to_path(str(certs.client_cert), append=i > 0)
    client.private_key_and_cert_chain_pem.write_to_path(str(certs.client_combined))
    return certs


def tls_server(path: Path, binary: str, certs: Certs, auth_clients: str) -> SecureServer:
    # --port 0: no plain-TCP listener at all, so everything below really goes over TLS.
    return SecureServer(path, "--tls-cert-file", str(certs.server_cert),
                        "--tls-key-file", str(certs.server_key),
                        "--tls-ca-cert-file", str(certs.ca),
                        "--tls-auth-clients", auth_clients,
                        port=0, tls_port=free_port(), binary=binary)
