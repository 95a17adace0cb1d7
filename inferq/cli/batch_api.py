"""A small client of the gateway's Files and Batches APIs for ``inferq batch``, on the standard
library only (the producer install stays light): JSON calls, a streamed multipart upload and
streamed downloads."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib import error, parse, request

URL_ENV = "INFERQ_API_URL"
TOKEN_ENV = "INFERQ_API_TOKEN"
DEFAULT_URL = "http://localhost:8000"


class ApiFailed(Exception):
    """The gateway answered an error (``code`` from its body), or could not be reached."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BatchApi:
    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout_s: float = 60.0) -> None:
        self.base = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.timeout_s = timeout_s

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _open(self, method: str, path: str, body: Any = None,
              headers: dict[str, str] | None = None) -> Any:
        req = request.Request(self.base + path, data=body, method=method,
                              headers=self._headers(headers))
        try:
            return request.urlopen(req, timeout=self.timeout_s)
        except error.HTTPError as exc:
            raw = exc.read()
            try:
                detail = json.loads(raw)["error"]
                raise ApiFailed(str(detail.get("code") or exc.code),
                                str(detail.get("message"))) from None
            except (ValueError, KeyError, TypeError):
                raise ApiFailed(str(exc.code), raw.decode(errors="replace")[:500]) from None
        except error.URLError as exc:
            raise ApiFailed("connection", f"cannot reach the gateway at {self.base}: "
                            f"{exc.reason}") from None

    def call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {} if payload is None else {"Content-Type": "application/json"}
        with self._open(method, path, body, headers) as response:
            return json.loads(response.read())

    def upload(self, path: Path, purpose: str = "batch") -> dict[str, Any]:
        """A multipart upload streamed from the file (never read whole into memory)."""
        boundary = uuid.uuid4().hex
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
                f"{purpose}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"{path.name}\"\r\nContent-Type: application/jsonl\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        size = len(head) + path.stat().st_size + len(tail)

        def parts() -> Iterator[bytes]:
            yield head
            with path.open("rb") as f:
                while block := f.read(1 << 20):
                    yield block
            yield tail

        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}",
                   "Content-Length": str(size)}
        with self._open("POST", "/v1/files", parts(), headers) as response:
            made: dict[str, Any] = json.loads(response.read())
            return made

    def download(self, file_id: str, target: Path) -> int:
        with self._open("GET", f"/v1/files/{parse.quote(file_id)}/content") as response, \
                target.open("wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
        return target.stat().st_size

    def create(self, file_id: str, endpoint: str, window: str,
               metadata: dict[str, str] | None) -> dict[str, Any]:
        payload: dict[str, Any] = {"input_file_id": file_id, "endpoint": endpoint,
                                   "completion_window": window}
        if metadata:
            payload["metadata"] = metadata
        made: dict[str, Any] = self.call("POST", "/v1/batches", payload)
        return made

    def batch(self, batch_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/v1/batches/{parse.quote(batch_id)}")
        return found
