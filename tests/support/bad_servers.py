"""Servers a user may point inferq at by mistake: one that accepts connections and never
answers (hung, or a firewall that black-holes), and one that answers like a web server (a
wrong port). Each runs in a thread on a free loopback port; ``url`` is a redis:// URL to it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def _serve(handle: str) -> Iterator[str]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)  # so the accept loop sees ``stop``
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if handle == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            held.append(conn)  # never answered (silent) / left open after the reply (http)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        for conn in held:
            conn.close()


@contextmanager
def silent_server() -> Iterator[str]:
    """Accepts every connection, reads nothing, answers nothing."""
    with _serve("silent") as url:
        yield url


@contextmanager
def http_server() -> Iterator[str]:
    """Answers every connection with an HTTP 400, as a web server on a mistaken port would."""
    with _serve("http") as url:
        yield url
