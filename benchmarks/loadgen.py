"""A lean HTTP/1.1 load generator: asyncio streams, keep-alive connections, one prepared request.

It costs little per request (no HTTP library: the request bytes are built once, a response is
its status line, headers and ``Content-Length`` body, or a chunked body), so the servers under
test, not the client, set the pace. Its own CPU per request is measured and reported by the
caller (``time.process_time`` of this process around a run).

* ``closed_loop(host, port, body, clients, n)``: ``clients`` connections, each sending its next
  request as soon as the previous answer arrives, until ``n`` answers;
* ``open_loop(host, port, body, rate, n, seed)``: ``n`` requests at Poisson arrival times of
  ``rate`` per second, each on an idle connection (a new one when none is idle); latency counts
  from the *scheduled* arrival, so a server that falls behind is charged for the wait
  (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field


class HttpError(RuntimeError):
    pass


def request_bytes(host: str, port: int, path: str, body: bytes,
                  headers: Sequence[tuple[str, str]] = ()) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}",
            "Content-Type: application/json", f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def call(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        status_line = await self.reader.readline()
        if not status_line:
            raise HttpError("connection closed by the server")
        status = int(status_line.split(b" ", 2)[1])
        length = -1
        chunked = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            return status, b"".join(parts)
        if length < 0:
            raise HttpError("response without Content-Length")
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


@dataclass
class LoadResult:
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    client_cpu_s: float = 0.0
    sample: bytes = b""

    @property
    def done(self) -> int:
        return len(self.latencies_ms)

    @property
    def throughput(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_cpu_us_per_request(self) -> float:
        return self.client_cpu_s / max(self.done, 1) * 1e6


async def closed_loop(host: str, port: int, raws: Sequence[bytes], clients: int,
                      n: int) -> LoadResult:
    """``clients`` keep-alive connections in a closed loop over the prepared requests
    ``raws`` (request ``i`` sends ``raws[i % len(raws)]``) until ``n`` answers."""
    conns = [await Connection.open(host, port) for _ in range(clients)]
    out = LoadResult()
    issued = 0

    async def loop(conn: Connection) -> None:
        nonlocal issued
        while issued < n:
            raw = raws[issued % len(raws)]
            issued += 1
            t0 = time.perf_counter()
            status, body = await conn.call(raw)
            if status != 200:
                out.errors.append(f"{status}: {body[:200]!r}")
                continue
            out.latencies_ms.append((time.perf_counter() - t0) * 1e3)
            if not out.sample:
                out.sample = body

    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        await asyncio.gather(*(loop(c) for c in conns))
    finally:
        out.seconds = time.perf_counter() - t0
        out.client_cpu_s = time.process_time() - cpu0
        for c in conns:
            c.close()
    return out


async def open_loop(host: str, port: int, raws: Sequence[bytes], rate: float, n: int,
                    seed: int = 0, warm_connections: int = 64) -> LoadResult:
    """``n`` requests at Poisson arrivals of ``rate``/s; latency from the scheduled arrival."""
    rng = random.Random(seed)
    idle = [await Connection.open(host, port) for _ in range(warm_connections)]
    every: list[Connection] = list(idle)
    out = LoadResult()

    async def one(i: int, due: float) -> None:
        conn = idle.pop() if idle else None
        try:
            if conn is None:
                raise HttpError("no idle connection")
            status, body = await conn.call(raws[i % len(raws)])
        except (HttpError, ConnectionError, asyncio.IncompleteReadError):
            # None idle, or the server closed an idle keep-alive connection (uvicorn does after
            # 5 s): a new connection, as any HTTP client does.
            if conn is not None:
                conn.close()
            conn = await Connection.open(host, port)
            every.append(conn)
            status, body = await conn.call(raws[i % len(raws)])
        idle.append(conn)
        if status != 200:
            out.errors.append(f"{status}: {body[:200]!r}")
            return
        out.latencies_ms.append((time.perf_counter() - due) * 1e3)

    cpu0, start = time.process_time(), time.perf_counter()
    tasks = []
    due = start
    try:
        for i in range(n):
            due += rng.expovariate(rate)
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, due)))
        await asyncio.gather(*tasks)
    finally:
        out.seconds = time.perf_counter() - start
        out.client_cpu_s = time.process_time() - cpu0
        for c in every:
            c.close()
    return out
