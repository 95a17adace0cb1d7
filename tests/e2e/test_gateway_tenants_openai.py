"""Two tenants through the official ``openai`` client, end to end: a real keyed gateway
(uvicorn), a real generate worker process, keys made with ``inferq keys create``. Each tenant
gets its own answers under the same client-chosen id, cannot see the other's requests or
files, is held to its key's priority ceiling, and sees its rate-limit headers."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import SecretStr

from inferq.cli.main import main
from tests.support.gateway import CHAT, serve
from tests.support.generation import MODEL
from tests.support.processes import WorkerProcess


def make_key(redis_url: str, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["keys", "create", *args, "--json", "--redis-url", redis_url]) == 0
    secret: str = json.loads(capsys.readouterr().out)["secret"]
    return secret


@pytest.fixture
def keyed_gateway(redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                  ) -> Iterator[tuple[str, str, str]]:
    """(base URL, acme's key, globex's key)."""
    from inferq.gateway import GatewaySettings

    acme = make_key(redis_url, capsys, "--tenant", "acme", "--max-priority", "5",
                    "--requests-per-minute", "1000")
    globex = make_key(redis_url, capsys, "--tenant", "globex")
    settings = GatewaySettings(redis_url=SecretStr(redis_url), timeout_s=120,
                               require_served_model=False, file_store=str(tmp_path / "files"))
    with serve(settings) as url:
        yield url, acme, globex


def test_two_tenants_share_a_gateway_through_the_openai_client(
        keyed_gateway: tuple[str, str, str], tiny_path: Path,
        start_worker: Callable[..., WorkerProcess]) -> None:
    url, acme_key, globex_key = keyed_gateway
    start_worker("--task", "generate", "--model", f"{MODEL}={tiny_path}", "--device", "cpu")
    acme = openai.OpenAI(base_url=url, api_key=acme_key, max_retries=0, timeout=120)
    globex = openai.OpenAI(base_url=url, api_key=globex_key, max_retries=0, timeout=120)
    same_id = {"X-Request-Id": "conversation-1"}

    raw = acme.chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=8, temperature=0, seed=1, extra_headers=same_id)
    mine = raw.parse()
    assert mine.choices[0].message.content and mine.id == "chatcmpl-conversation-1"
    assert raw.headers["x-ratelimit-limit-requests"] == "1000"
    assert int(raw.headers["x-ratelimit-remaining-requests"]) == 999
    # globex sends the same id: its own request, not acme's answer
    theirs = globex.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Something else entirely."}],
        max_tokens=8, temperature=0, seed=1, extra_headers=same_id)
    assert theirs.id == "chatcmpl-conversation-1" and theirs.usage is not None
    assert theirs.usage.prompt_tokens != mine.usage.prompt_tokens  # type: ignore[union-attr]

    # an id only acme has is a 404 for globex (read, stream resume, cancel)
    acme.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                 extra_headers={"X-Request-Id": "acme-only"})
    http = httpx.Client(base_url=url.removesuffix("/v1"), timeout=30)
    path = f"/v1/requests/acme-only?model={MODEL}&task=generate"
    assert http.get(path, headers={"Authorization": f"Bearer {acme_key}"}).status_code == 200
    for method, route in (("GET", path), ("DELETE", path),
                          ("GET", f"/v1/requests/acme-only/stream?model={MODEL}")):
        answer = http.request(method, route, headers={"Authorization": f"Bearer {globex_key}"})
        assert answer.status_code == 404, (method, route, answer.text)

    # the key's ceiling, as the openai client raises it
    with pytest.raises(openai.PermissionDeniedError, match="max_priority 5"):
        acme.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                     extra_headers={"X-Priority": "9"})
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="iq_not-a-key", max_retries=0).models.list()

    # files: another tenant's file does not exist for it
    made = acme.files.create(file=("in.jsonl", io.BytesIO(b'{"custom_id": "a"}\n')),
                             purpose="batch")
    with pytest.raises(openai.NotFoundError):
        globex.files.retrieve(made.id)
    assert made.id in [f.id for f in acme.files.list()]
    assert made.id not in [f.id for f in globex.files.list()]
