"""``inferq worker --engine``: its own option (never an abbreviation of ``--engine-process``),
and the flags of one engine refused for the other, before Redis is reached or a model loads."""

from __future__ import annotations

import pytest

from inferq.cli.main import build_parser, main
from inferq.embedded import free_port

NOWHERE = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
GENERATE = ["--model", "x=/m", "--task", "generate"]


def parse(*flags: str) -> dict[str, object]:
    return vars(build_parser().parse_args(["worker", *GENERATE, *flags]))


def test_engine_is_its_own_option_not_an_abbreviation_of_engine_process() -> None:
    args = parse("--engine", "vllm")
    assert args["engine"] == "vllm" and "engine_process" not in args
    assert parse("--engine", "transformers", "--no-engine-process")["engine_process"] is False
    assert "engine" not in parse()  # the default lives in GenerationSettings


@pytest.mark.parametrize("flags", [["--engine-p"], ["--eng", "vllm"], ["--max-sl", "4"]])
def test_abbreviated_worker_flags_are_refused(flags: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["worker", *GENERATE, *flags])
    assert exit_.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "reason"), [
    (["--engine", "vllm", "--swap-mb", "64"],
     "--swap-mb: not for --engine vllm: vLLM keeps its KV blocks"),
    (["--engine", "vllm", "--no-engine-process"],
     "--no-engine-process: not for --engine vllm: vLLM's engine always runs in the engine "
     "process"),
    (["--vllm-option", "enforce_eager=true"],
     "--vllm-option: not for --engine transformers"),
    (["--engine", "transformers", "--vllm-option", "enforce_eager=true"],
     "--vllm-option: not for --engine transformers"),
    (["--engine", "vllm", "--vllm-option", "max_num_seqs=3"],
     "--vllm-option max_num_seqs: set by inferq (--max-slots)"),
])
def test_a_flag_of_the_other_engine_is_refused_with_the_reason(
        flags: list[str], reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--redis-url", NOWHERE, *GENERATE, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferq: error [invalid_config]: ") and err.count("\n") == 1, err
    assert reason in err


@pytest.mark.parametrize("flags", [["--task", "embed", "--engine", "vllm"],
                                   ["--task", "generate", "--batching", "request", "--engine",
                                    "vllm"]])
def test_engine_is_refused_for_the_window_worker(flags: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--redis-url", NOWHERE, "--model", "x=/m", *flags]) == 2
    err = capsys.readouterr().err
    assert "--engine: only the continuous generate worker" in err


def test_engine_vllm_without_vllm_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("inferq.worker.generate.vllm.load.vllm_available", lambda: False)
    assert main(["worker", "--redis-url", NOWHERE, *GENERATE, "--engine", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "--engine vllm: vLLM is not installed here" in err and "inferq[vllm]" in err


def test_the_continuous_flags_defaults_are_the_ones_help_names(
        capsys: pytest.CaptureFixture[str]) -> None:
    from inferq.cli.worker import generation_settings

    settings = generation_settings(build_parser().parse_args(["worker", *GENERATE]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for flag, value in (("--max-slots", settings.max_slots),
                        ("--max-prefill-tokens", settings.max_prefill_tokens),
                        ("--stream-interval-ms", settings.stream_interval_ms),
                        ("--max-preemptions", settings.max_preemptions),
                        ("--prefix-cache-mb", settings.prefix_cache_mb)):
        shown = help_text.split(f"{flag} ", 2)[-1].split(" --")[0]
        assert f"(default: {value:g}" in shown, (flag, shown)
