"""A worker started while its Redis server restarts (refused connections, then LOADING) waits
for it, for a bound, instead of exiting: a supervisor restarts workers at the moment the server
restarts too, and a replacement that gave up at once leaves the fleet short for another start
(``inferq.cli.worker.check_server``)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from inferq.cli.worker import check_server
from inferq.connection import ConnectionSettings
from inferq.embedded import EmbeddedServer, free_port
from inferq.errors import BackendUnavailable
from tests.support.processes import wait_until


def test_a_server_that_starts_late_is_waited_for(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    server = EmbeddedServer(tmp_path, port=free_port())
    outcome: list[BaseException | None] = []

    def check() -> None:
        try:
            check_server(ConnectionSettings(server.url), wait_s=60)
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    caplog.set_level(logging.WARNING, logger="inferq.worker")
    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    wait_until(lambda: "Redis not available yet" in caplog.text, 30, "the first refusal")
    assert outcome == []  # still asking
    server.start()
    try:
        thread.join(timeout=60)
        assert outcome == [None]
    finally:
        server.stop()


def test_a_server_that_stays_down_fails_after_the_bound(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="cannot connect"):
        check_server(ConnectionSettings(url), wait_s=0.5)
    assert 0.3 <= time.monotonic() - started < 10


def test_a_server_loading_its_data_is_waited_for(tmp_path: Path) -> None:
    """What a replacement worker met in a chaos run: the restarted server answered LOADING
    (here a stand-in on the port answers every command so), then the real server serves."""
    port = free_port()
    stand_in = socket.create_server(("127.0.0.1", port))
    answered = threading.Event()

    def loading() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = stand_in.accept()
                with conn:
                    while conn.recv(65536):
                        conn.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")
                        answered.set()

    threading.Thread(target=loading, daemon=True).start()
    server = EmbeddedServer(tmp_path, port=port)
    outcome: list[BaseException | None] = []

    def check() -> None:
        try:
            check_server(ConnectionSettings(server.url), wait_s=60)
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    assert answered.wait(30)
    stand_in.close()
    server.start()
    try:
        thread.join(timeout=60)
        assert outcome == [None]
    finally:
        server.stop()
