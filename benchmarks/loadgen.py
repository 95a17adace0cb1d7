"""The load generators every scenario uses, over any async ``call(i)`` (the i-th request): a
closed loop, and one paced open-loop sender whose latency counts from each request's scheduled
arrival (no coordinated omission); and a lean HTTP/1.1 client to drive them (asyncio streams,
keep-alive connections, prepared request bytes, so the servers, not the client, set the pace).
Each run measures its own CPU (``time.process_time``) and wall time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Call = Callable[[int], Awaitable[Any]]


class HttpError(RuntimeError):
    pass


@dataclass
class LoadResult:
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Open loop: per request, (scheduled, finished) in seconds since the start and its value.
    records: list[tuple[float, float, Any] | None] = field(default_factory=list)
    seconds: float = 0.0
    client_cpu_s: float = 0.0
    worst_late_s: float = 0.0

    @property
    def done(self) -> int:
        return len(self.latencies_ms)

    @property
    def throughput(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_cpu_us_per_request(self) -> float:
        return self.client_cpu_s / max(self.done, 1) * 1e6


def poisson(rate: float, rng: random.Random, *, n: int | None = None,
            seconds: float | None = None, start: float = 0.0) -> list[float]:
    """Poisson arrival times (seconds) after ``start``: ``n`` of them, or all before
    ``seconds``."""
    times: list[float] = []
    t = start + rng.expovariate(rate)
    while (n is None or len(times) < n) and (seconds is None or t < seconds):
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def watched(future: Awaitable[Any], check: Callable[[], None] | None) -> Any:
    """``future``'s value; ``check()`` runs every 0.5 s meanwhile (to fail fast when a worker
    died or time ran out)."""
    task = asyncio.ensure_future(future)
    try:
        while not (await asyncio.wait({task}, timeout=0.5))[0]:
            if check is not None:
                check()
        return task.result()
    finally:
        task.cancel()


async def _timed(out: LoadResult, run: Awaitable[Any]) -> LoadResult:
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        await run
    finally:
        out.seconds = time.perf_counter() - t0
        out.client_cpu_s = time.process_time() - cpu0
    return out


async def closed_loop(calls: Sequence[Call], n: int) -> LoadResult:
    """One loop per element of ``calls`` (a client), each sending its next request as soon as
    its previous answer arrives, until ``n`` answers; latency from each send."""
    out = LoadResult()
    issued = 0

    async def loop(call: Call) -> None:
        nonlocal issued
        while issued < n:
            issued += 1
            t0 = time.perf_counter()
            try:
                await call(issued - 1)
            except HttpError as exc:
                out.errors.append(str(exc))
                continue
            out.latencies_ms.append((time.perf_counter() - t0) * 1e3)

    return await _timed(out, asyncio.gather(*(loop(c) for c in calls)))


async def open_loop(call: Call, arrivals: Sequence[float],
                    check: Callable[[], None] | None = None) -> LoadResult:
    """Request ``i`` starts at ``arrivals[i]`` seconds after the start, whatever happened to
    the earlier ones, in a task of its own; latency from the scheduled arrival. ``check()``
    runs before each start and every 0.5 s while the last ones are awaited."""
    out = LoadResult(records=[None] * len(arrivals))
    start = time.perf_counter()

    async def one(i: int) -> None:
        try:
            value = await call(i)
        except HttpError as exc:
            out.errors.append(str(exc))
            return
        finished = time.perf_counter() - start
        out.records[i] = (arrivals[i], finished, value)
        out.latencies_ms.append((finished - arrivals[i]) * 1e3)

    async def send() -> None:
        tasks = []
        for i, at in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            out.worst_late_s = max(out.worst_late_s, -delay)
            if check is not None:
                check()
            tasks.append(asyncio.create_task(one(i)))
        await watched(asyncio.gather(*tasks), check)

    return await _timed(out, send())


# ------------------------------------------------------------------------------- HTTP


def request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
            f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(*await asyncio.open_connection(host, port))

    async def call(self, raw: bytes) -> tuple[int, bytes]:
        """Send ``raw``; the response's status and body (``Content-Length`` or chunked)."""
        self.writer.write(raw)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed by the server")
        status, length, chunked = int(status_line.split(b" ", 2)[1]), -1, False
        while (line := await self.reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if not chunked:
            if length < 0:
                raise HttpError("response without Content-Length")
            return status, await self.reader.readexactly(length)
        parts = []
        while size := int((await self.reader.readline()).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readline()
        await self.reader.readline()
        return status, b"".join(parts)

    def close(self) -> None:
        self.writer.close()


class HttpPool:
    """Keep-alive connections to one server, each carrying one request at a time; ``call(i)``
    sends the prepared request ``raws[i % len(raws)]`` on an idle one (a new one when none is
    idle, or when the server closed an idle one: uvicorn does after 5 s, as any client would)
    and raises HttpError unless the answer is 200."""

    def __init__(self, host: str, port: int, raws: Sequence[bytes]) -> None:
        self.host, self.port, self.raws = host, port, raws
        self.idle: list[Connection] = []
        self.every: list[Connection] = []

    async def connect(self, n: int) -> HttpPool:
        for _ in range(n):
            self.every.append(await Connection.open(self.host, self.port))
        self.idle = list(self.every)
        return self

    async def call(self, i: int) -> bytes:
        raw = self.raws[i % len(self.raws)]
        conn = self.idle.pop() if self.idle else None
        try:
            if conn is None:
                raise ConnectionError("no idle connection")
            status, body = await conn.call(raw)
        except (ConnectionError, asyncio.IncompleteReadError):
            if conn is not None:
                conn.close()
            conn = await Connection.open(self.host, self.port)
            self.every.append(conn)
            status, body = await conn.call(raw)
        self.idle.append(conn)
        if status != 200:
            raise HttpError(f"{status}: {body[:200]!r}")
        return body

    def close(self) -> None:
        for c in self.every:
            c.close()
