"""A Redis Sentinel deployment on loopback for tests: a master, two replicas (so that a
promoted one still has a replica: ``durability="replica"`` goes on after a failover) and three
sentinels (``redis-server --sentinel``), each a real process with its own folder."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from inferq.embedded import EmbeddedServer, find_server_binary, free_port, stop_process
from tests.support.processes import wait_until

SERVICE = "inferq"


class SentinelDeployment:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.master = EmbeddedServer(folder / "master")
        self.replicas = [EmbeddedServer(folder / f"replica-{i}") for i in range(2)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        self.master.start()
        for replica in self.replicas:
            replica.extra_args = ("--replicaof", "127.0.0.1", str(self.master.port))
            replica.start()
        for port in self.sentinel_ports:
            conf = self.folder / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n")
            self.sentinels.append(subprocess.Popen(
                [find_server_binary(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE))
        for port in self.sentinel_ports:
            with redis.Redis(port=port) as s:
                wait_until(lambda s=s: self._sees_everyone(s), 30,
                           f"sentinel {port} to see the replica and its peers")

    @staticmethod
    def _sees_everyone(s: redis.Redis) -> bool:
        try:
            master = s.sentinel_master(SERVICE)
        except redis.RedisError:
            return False
        return int(master.get("num-slaves", 0)) >= 2 and int(
            master.get("num-other-sentinels", 0)) >= 2

    def master_port(self) -> int:
        """The port of the master the sentinels name now."""
        with redis.Redis(port=self.sentinel_ports[0]) as s:
            return int(s.sentinel_get_master_addr_by_name(SERVICE)[1])

    def kill_master(self) -> None:
        """SIGKILL the master (no shutdown, no AOF flush: a crash)."""
        assert self.master.process is not None
        self.master.process.kill()
        self.master.process.wait()

    def wait_failover(self, timeout_s: float = 60.0) -> float:
        """Until the sentinels name a replica as master; seconds it took."""
        start = time.monotonic()
        ports = {replica.port for replica in self.replicas}
        wait_until(lambda: self.master_port() in ports, timeout_s,
                   "the sentinels to promote a replica")
        return time.monotonic() - start

    def stop(self) -> None:
        for process in self.sentinels:
            stop_process(process)
        for server in (*self.replicas, self.master):
            if server.process is not None and server.process.poll() is None:
                server.stop()

    def __enter__(self) -> SentinelDeployment:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
