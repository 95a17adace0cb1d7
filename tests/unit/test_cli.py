"""The CLI tree: each kind of worker refuses the other kind's flags, with the reason, before it
connects; the flags it owns reach its config, and the ones not given keep the config's
defaults."""

from __future__ import annotations

import argparse
import io
import socket
import time
from typing import Any

import pytest

import inferq
from inferq.cli.enqueue import read_requests
from inferq.cli.main import build_parser, main
from inferq.embedded import free_port

NOWHERE = f"redis://:secret@127.0.0.1:{free_port()}/0"  # nothing listens there


@pytest.mark.parametrize(("flags", "reason"), [
    (["--model", "x=/m", "--task", "generate", "--max-wait-ms", "5"],
     "--max-wait-ms: a --task generate worker batches at every decode step and has no window"),
    (["--model", "x=/m", "--task", "generate", "--max-batch-size", "8", "--max-batch-tokens", "0"],
     "--max-batch-size, --max-batch-tokens: a --task generate worker"),
    (["--model", "echo", "--max-slots", "4"],
     "--max-slots: only the continuous generate worker has slots, a KV cache and token streams; "
     "this worker (--task embed) batches adaptive windows"),
    (["--model", "x=/m", "--task", "score", "--kv-cache-mb", "64"], "(--task score)"),
    (["--model", "x=/m", "--task", "generate", "--batching", "request",
      "--stream-interval-ms", "5"], "--stream-interval-ms: only the continuous"),
    (["--model", "echo", "--task", "generate", "--max-prefill-tokens", "9"],
     "(the built-in model 'echo')"),
    (["--model", "echo", "--batching", "request"],
     "--batching: only --task generate has a choice of batching"),
    (["--model", "echo", "--task", "generate", "--batching", "continuous"],
     "--batching continuous: the built-in model 'echo' has no KV cache"),
])
def test_a_flag_the_worker_kind_would_ignore_is_refused_with_the_reason(
        flags: list[str], reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--redis-url", NOWHERE, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferq: error [invalid_config]: ") and err.count("\n") == 1, err
    assert reason in err


def test_given_flags_reach_the_config_and_the_rest_keep_its_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    configs: list[Any] = []

    class Recorder:
        abandoned = False

        def __init__(self, config: Any, model: Any) -> None:
            configs.append(config)

        async def run(self) -> int:
            return 0

    monkeypatch.setattr("inferq.worker.window.worker.WindowWorker", Recorder)
    monkeypatch.setattr("inferq.cli.worker.check_server", lambda settings: None)  # no server
    assert main(["worker", "--redis-url", NOWHERE, "--model", "echo", "--max-wait-ms", "5",
                 "--max-batch-tokens", "0", "--lease-ms", "900"]) == 0
    (config,) = configs
    assert (config.max_wait_ms, config.max_batch_tokens, config.lease_ms) == (5.0, None, 900)
    assert (config.max_batch_size, config.result_ttl_s, config.device) == (32, 3600.0, "auto")
    assert (config.suspect_delay_ms, config.suspect_pace_ms) == (None, 900)  # the lease
    assert main(["worker", "--redis-url", NOWHERE, "--model", "echo",
                 "--suspect-delay-ms", "0"]) == 0
    assert configs[-1].suspect_pace_ms == 0
    assert configs[-1].max_batch_tokens == 8192  # the default --help names


def test_a_bad_suspect_delay_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--redis-url", NOWHERE, "--model", "echo",
                 "--suspect-delay-ms", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferq: error [invalid_config]: suspect_delay_ms must be in"), err


def test_an_unreachable_server_is_one_line_naming_it_without_the_password(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "x", "--model", "m", "--no-wait", "--redis-url", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferq: error [connection]: cannot connect at redis://:***@127.0.0.1")
    assert "secret" not in err and err.count("\n") == 1


# ------------------------------------------------------------ a new user's first commands


def test_version_and_the_top_help_speak_to_users(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"inferq {inferq.__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "inferq worker --model minilm" in out and "inferq enqueue" in out
    assert "Each command is one module" not in out  # not the developer docstring


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings
            and not isinstance(a, argparse._HelpAction)]


def test_every_flag_of_every_command_has_help_and_shows_its_default() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        for action in _options(command):
            assert action.help, f"inferq {name} {action.option_strings[0]} has no help"
        text = command.format_help()
        if name != "gateway":
            assert "--log-level" in text, name  # accepted after the command too
    enqueue = sub.choices["enqueue"].format_help()
    assert "{embed,generate,score}" in enqueue and "-100..100" in enqueue
    assert "(default: 60.0)" in enqueue  # --timeout
    worker = sub.choices["worker"].format_help()
    assert "--device {auto,cpu,cuda}" in worker and "default: auto" in worker


def test_log_options_work_after_the_command(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr("inferq.cli.main.configure_logging",
                        lambda level, fmt: seen.append((level, fmt)))
    main(["stats", "--redis-url", "redis://localhost:notaport/0", "--log-level", "debug",
          "--log-format", "text"])
    main(["--log-level", "error", "stats", "--redis-url", "redis://localhost:notaport/0"])
    assert seen == [("DEBUG", "text"), ("ERROR", "auto")]


@pytest.mark.parametrize("argv", [
    ["stats"],
    ["enqueue", "x", "--model", "m"],
    ["worker", "--model", "echo"],
])
def test_a_url_with_a_bad_port_is_one_line(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--redis-url", "redis://localhost:notaport/0"]) == 2
    err = capsys.readouterr().err
    assert err == ("inferq: error [invalid_config]: invalid port 'notaport' in Redis URL "
                   "'redis://localhost:notaport/0' (expected redis://host:PORT/DB, PORT a "
                   "number)\n")


@pytest.mark.parametrize("path", ["nosuch.jsonl", "."])
def test_enqueue_file_that_cannot_be_read_is_one_line(
        path: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "--file", path, "--model", "m", "--redis-url", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"inferq: error [invalid_request]: --file {path}: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_enqueue_file_dash_reads_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO('"a"\n{"prompt": "b", "priority": 3}\n\n'))
    assert read_requests("-") == [{"prompt": "a"}, {"prompt": "b", "priority": 3}]


def test_worker_metrics_port_in_use_is_one_line_before_the_model_loads(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("inferq.cli.worker.check_server", lambda settings: None)
    loads: list[str] = []
    monkeypatch.setattr("inferq.worker.models.registry.load_model",
                        lambda *a, **k: loads.append("loaded"))
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["worker", "--redis-url", NOWHERE, "--model", "echo",
                     "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err  # a log line (connecting to ...), then the error
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"inferq: error [invalid_config]: --metrics-port {port}: already in use (choose "
        "another port, or 0 for any free one)")
    assert loads == []


@pytest.mark.parametrize(("model", "env", "reason"), [
    ("foo=/nonexistent/path", {}, "--model foo=/nonexistent/path: no such folder"),
    ("nosuchmodel", {"HF_HUB_OFFLINE": "1"},
     "--model nosuchmodel: 'nosuchmodel' is not a local folder, not a known name (minilm, "
     "smollm2, echo, sleep), and not in the Hugging Face cache, and HF_HUB_OFFLINE is set"),
])
def test_a_model_that_cannot_be_found_fails_at_once_in_one_line(
        model: str, env: dict[str, str], reason: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("inferq.cli.worker.check_server", lambda settings: None)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    assert main(["worker", "--redis-url", NOWHERE, "--model", model]) == 2
    assert time.monotonic() - started < 30  # no minute of hub retries
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"inferq: error [invalid_config]: {reason}")


def test_worker_checks_the_server_before_loading_the_model(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("inferq.cli.worker.SERVER_WAIT_S", 0.2)  # asks again only that long
    loads: list[str] = []
    monkeypatch.setattr("inferq.worker.models.registry.load_model",
                        lambda *a, **k: loads.append("loaded"))
    assert main(["worker", "--redis-url", NOWHERE, "--model", "echo"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1].startswith(
        "inferq: error [connection]: cannot connect at redis://:***@127.0.0.1")
    assert loads == [] and "loading model" not in err


def test_gateway_help_lists_its_settings_and_redis_url(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    from inferq.gateway.__main__ import build_parser as gateway_parser

    text = gateway_parser().format_help()
    for name in ("--redis-url", "INFERQ_GATEWAY_TOKEN", "INFERQ_GATEWAY_TIMEOUT_S",
                 "INFERQ_GATEWAY_RETRY_AFTER_S", "INFERQ_GATEWAY_REQUIRE_SERVED_MODEL"):
        assert name in text, name


def test_gateway_bad_redis_url_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    assert main(["gateway", "--redis-url", "redis://localhost:notaport/0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferq gateway: invalid settings: invalid port 'notaport'")
    assert err.count("\n") == 1
