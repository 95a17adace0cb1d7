"""Small helpers every benchmark scenario shares: the machine description, child processes
that are always cleaned up, CPU accounting, summary statistics, and writing JSON and
``RESULTS.md``. Nothing here knows about inferq."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import datetime as dt
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"
RESULTS_HEADER = """# inferq benchmark results

Each section below is written by one scenario of `python -m benchmarks <scenario>` and is
replaced, between its markers, every time that scenario runs. Numbers from `--quick` runs are
marked as such: they are a smoke test, not a measurement.
"""


class BenchmarkFailed(RuntimeError):
    """A worker died or stopped answering, or a result was wrong; the message says which."""


# ------------------------------------------------------------------------------ machine


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def physical_cores() -> int | None:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo, when the kernel reports them."""
    cores: set[tuple[str, str]] = set()
    phys = core = ""
    for line in [*_read("/proc/cpuinfo").splitlines(), ""]:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif not key and core:
            cores.add((phys, core))
            phys = core = ""
    return len(cores) or None


def ram_gib() -> float | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def version(module: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    try:
        from importlib.metadata import version
        return version(module)
    except Exception:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine_info(*, server_binary: str | None = None) -> dict[str, Any]:
    """CPU, cores, RAM, GPU, load and the versions that matter for a benchmark's numbers."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "physical_cores": physical_cores(),
        "ram_gib": ram_gib(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "gpu": None,
        "versions": {
            "python": platform.python_version(),
            "torch": version("torch"),
            "transformers": version("transformers"),
            "tokenizers": version("tokenizers"),
            "redis_py": version("redis"),
            "hiredis": version("hiredis"),
            "inferq": version("inferq"),
        },
        "git": {"commit": _git("rev-parse", "HEAD"),
                "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))},
    }
    try:
        import torch
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    if server_binary:
        try:
            out = subprocess.run([server_binary, "--version"], capture_output=True, text=True,
                                 timeout=10)
            info["versions"]["server"] = out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["versions"]["server"] = None
    return info


def describe_machine(info: Mapping[str, Any]) -> str:
    cores = info.get("usable_cpus") or info.get("logical_cpus")
    gpu = ", ".join(info["gpu"]) if info.get("gpu") else "no GPU"
    v = info["versions"]
    return (f"{info['cpu_model']}, {cores} CPUs, {info['ram_gib']} GiB RAM, {gpu}; "
            f"Python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, "
            f"redis-py {v['redis_py']}, {v.get('server') or 'server ?'}")


# ---------------------------------------------------------------------- child processes

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the benchmark dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_EXEC_DYING_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so that, on Linux, the program gets SIGTERM if this process dies
    without cleaning up (SIGKILL, a crash). For children started by code we do not own (the
    embedded server); the signal setting survives ``exec``, and the pid stays the same."""
    if sys.platform != "linux":
        return list(argv)
    return [sys.executable, "-c", _EXEC_DYING_WITH_PARENT, *argv]


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None
    log_file: IO[bytes] | None

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


class Cleanup:
    """Owns everything a benchmark starts and stops it all, exactly once, however the run
    ends: normal exit, exception, Ctrl-C, SIGTERM/SIGHUP, or interpreter exit (atexit).

    Children run in their own session, so a terminal Ctrl-C reaches only the benchmark,
    which then stops them in reverse start order (workers before the server they use).
    On Linux they also get SIGTERM if the benchmark dies without cleaning up."""

    def __init__(self) -> None:
        self._stops: list[tuple[str, Callable[[], object]]] = []
        self._lock = threading.Lock()
        self._previous: dict[int, Any] = {}
        atexit.register(self.close)

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGHUP raise KeyboardInterrupt like Ctrl-C does, so ``finally`` runs."""
        def handler(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                self._previous[sig] = signal.signal(sig, handler)

    def on_close(self, name: str, stop: Callable[[], object]) -> None:
        with self._lock:
            self._stops.append((name, stop))

    def spawn(self, name: str, argv: Sequence[str], *, log_path: Path | None = None,
              env: Mapping[str, str] | None = None) -> Child:
        log_file = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = log_path.open("wb")
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log_file or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if log_file else subprocess.DEVNULL,
            env=dict(env) if env is not None else None, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        child = Child(name, process, log_path, log_file)
        self.on_close(name, lambda: stop_child(child))
        return child

    def close(self) -> None:
        """Stop everything registered, newest first. Safe to call more than once."""
        with self._lock:
            stops, self._stops = self._stops[::-1], []
        # A second Ctrl-C during cleanup must not leave the remaining processes running.
        previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is \
            threading.main_thread() else None
        if previous is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for name, stop in stops:
                try:
                    stop()
                except Exception as exc:
                    print(f"benchmarks: cleanup of {name} failed: {exc!r}", file=sys.stderr)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            for sig, old in self._previous.items():
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(sig, old)
            self._previous = {}


def stop_child(child: Child, *, grace_s: float = 20.0) -> int | None:
    """SIGTERM (a worker finishes its batch and gives claims back), then SIGKILL."""
    process = child.process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
    if child.log_file is not None and not child.log_file.closed:
        child.log_file.close()
    return process.returncode


def cpu_seconds(pid: int | None = None, *, children: bool = False) -> float | None:
    """User + system CPU seconds of a process (all its threads; this process when ``pid`` is
    None), plus (``children``) those of the children it has waited for: rq's forked work
    horses, a server's rewrite child. This process counts itself only: its exited children
    are the workers a scenario stopped. Unlike wall time, this barely moves when other
    tenants load the machine."""
    if pid is None or pid == os.getpid():
        t = os.times()
        return t.user + t.system
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # fields[0] is field 3 ("state") of proc(5)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def system_busy_seconds() -> float | None:
    """CPU seconds all CPUs of the machine spent busy (not idle, not waiting for I/O)."""
    line = _read("/proc/stat").split("\n", 1)[0].split()
    if not line or line[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in line[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class CpuProbe:
    """CPU seconds spent by a named set of our processes between ``start`` and ``stop``, and
    how much of the machine *other* processes used meanwhile (``other_load``: the share of
    all CPUs busy with work that is not ours), which tells a clean measurement from one
    disturbed by other tenants. ``children``: see ``cpu_seconds``."""

    def __init__(self, pids: Mapping[str, int | None], *, children: bool = False) -> None:
        self.pids = dict(pids)
        self.children = children
        self._start: dict[str, float | None] = {}
        self._system: float | None = None
        self._wall = 0.0

    def start(self) -> None:
        self._start = {name: cpu_seconds(pid, children=self.children)
                       for name, pid in self.pids.items()}
        self._system = system_busy_seconds()
        self._wall = time.perf_counter()

    def stop(self) -> dict[str, float | None]:
        wall = time.perf_counter() - self._wall
        system = system_busy_seconds()
        out: dict[str, float | None] = {}
        for name, pid in self.pids.items():
            before, after = self._start.get(name), cpu_seconds(pid, children=self.children)
            out[name] = None if before is None or after is None else round(after - before, 4)
        ours = sum(v for v in out.values() if v is not None)
        if system is None or self._system is None or wall <= 0:
            out["other_load"] = None
        else:
            other = max(0.0, system - self._system - ours)
            out["other_load"] = round(min(1.0, other / (wall * usable_cpus())), 3)
        out["wall_s"] = round(wall, 4)
        return out


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method), ``q`` in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)
                ) -> dict[str, float | None]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` (``qs``) of ``values``."""
    return {f"p{q}": percentile(values, q) for q in qs}


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; None when either is missing or ``b`` is 0."""
    return None if a is None or not b else a / b


def fmt_number(v: float | None, digits: int = 0) -> str:
    """``12,345`` (``digits`` decimals), ``n/a`` for None."""
    return "n/a" if v is None else f"{v:,.{digits}f}"


def verdict(value: float | None, target: float, *, at_most: bool = False) -> str:
    """``PASS`` or ``MISS`` against ``target``, a minimum (with ``at_most``, a maximum);
    ``n/a`` without a value."""
    if value is None:
        return "n/a"
    return "PASS" if (value <= target if at_most else value >= target) else "MISS"


def scaled(s: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """A ``summary`` with every figure multiplied by ``factor`` (e.g. 100 for percent)."""
    out: dict[str, Any] = {}
    for key, value in s.items():
        if isinstance(value, list):
            out[key] = [x * factor for x in value]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value * factor
        else:
            out[key] = value
    return out


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median and range over trials (the trials themselves are kept as well)."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "min": None, "max": None, "trials": []}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "trials": vals}


def fmt_range(s: Mapping[str, Any], digits: int = 1, unit: str = "") -> str:
    """``123.4 (118.0..130.2)`` for a summary; just the median for a single trial."""
    if s.get("median") is None:
        return "n/a"
    med = f"{s['median']:.{digits}f}{unit}"
    if len(s.get("trials", [])) < 2:
        return med
    return f"{med} ({s['min']:.{digits}f}..{s['max']:.{digits}f})"


# ------------------------------------------------------------------------------- output


def command_line() -> str:
    return shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]])


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def update_results_md(section: str, body: str, path: Path = RESULTS_MD) -> None:
    """Replace this scenario's section between ``<!-- {section}:start -->`` and
    ``<!-- {section}:end -->`` (appending it when absent); other sections are untouched."""
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else RESULTS_HEADER
    i, j = text.find(start), text.find(end)
    if i >= 0 and j > i:
        text = text[:i] + block + text[j + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def say(message: str) -> None:
    """Print what the benchmark is doing (runs are long; silence looks like a hang)."""
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def names_of(known: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: comma-separated names, each one of ``known``."""
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n for n in text.split(",") if n)
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; known: {', '.join(known)}")
        return names
    return parse
