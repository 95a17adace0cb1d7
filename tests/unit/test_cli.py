"""The CLI tree: each kind of worker refuses the other kind's flags, with the reason, before it
connects; the flags it owns reach its config, and the ones not given keep the config's
defaults."""

from __future__ import annotations

from typing import Any

import pytest

from inferq.cli.main import main
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

    monkeypatch.setattr("inferq.worker.window.worker.Worker", Recorder)
    assert main(["worker", "--redis-url", NOWHERE, "--model", "echo", "--max-wait-ms", "5",
                 "--max-batch-tokens", "0", "--lease-ms", "900"]) == 0
    (config,) = configs
    assert (config.max_wait_ms, config.max_batch_tokens, config.lease_ms) == (5.0, None, 900)
    assert (config.max_batch_size, config.result_ttl_s, config.device) == (32, 3600.0, "auto")


def test_an_unreachable_server_is_one_line_naming_it_without_the_password(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "x", "--model", "m", "--no-wait", "--redis-url", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferq: error [connection]: cannot connect at redis://:***@127.0.0.1")
    assert "secret" not in err and err.count("\n") == 1
