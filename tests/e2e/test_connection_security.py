"""Connection security through the CLI and worker processes, against real servers started
here: clear one-line errors for a wrong password, a missing permission or an untrusted
certificate; worker logs that never show a secret; TLS settings from flags and environment.
The TLS tests skip, with the reason, where no server build has TLS."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

import inferq
from inferq.connection import ConnectionSettings, describe_error, sync_client
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.processes import WorkerProcess
from tests.support.security import (
    ACL_PASSWORD,
    ACL_USER,
    QUOTED,
    Certs,
    admin_client,
    cli,
    round_trip,
    secrets_in,
    worker_config,
)
from tests.support.servers import SecureServer


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

    worker = WindowWorker(worker_config(url, "acl"), EchoModel())
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
        done = cli("enqueue", "over tls", "--model", "echo", "--json", "--redis-url", url,
                   "--tls-ca", str(certs.ca), "--timeout", "60")
        assert done.returncode == 0, done.stderr + worker.log
        assert '"output": "over tls"' in done.stdout
        stats = cli("stats", "--redis-url", url, env={"INFERQ_TLS_CA": str(certs.ca)})
        assert stats.returncode == 0, stats.stderr
        assert "queue embed:echo" in stats.stdout and "live workers 1" in stats.stdout
    finally:
        assert worker.stop() == 0, worker.log
    assert f"connecting to {url} (CA {certs.ca})" in worker.log


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
