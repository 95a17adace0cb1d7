"""Where file contents live: any fsspec filesystem. A plain path or ``file://`` is a local
directory (the default, for the embedded and compose setups); ``s3://bucket/prefix`` goes
through s3fs (``pip install s3fs``), with its usual settings (``AWS_*`` variables, or
``INFERQ_GATEWAY_FILE_STORE_OPTIONS`` as JSON for an endpoint URL). Metadata stays in Redis.

In a local directory, every file is written with mode 0600 and every folder made with 0700
(whatever the umask): a batch's prompts and outputs are readable by the gateway's user only.

The calls are blocking (fsspec's sync API): the gateway runs them on a thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import fsspec
from fsspec.core import url_to_fs

from inferq.errors import ConfigError

#: Bytes copied per read when streaming a file through (bounded memory).
BLOCK = 1 << 20
#: Modes of what the store makes in a local directory: the gateway's user only.
FILE_MODE = 0o600
DIR_MODE = 0o700


class FileStore:
    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        if not url:
            raise ConfigError("file store: an empty URL (give a directory or s3://bucket/prefix)")
        try:
            fs, root = url_to_fs(url, **dict(options or {}))
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"file store {url!r}: {exc}") from exc
        self.url = url
        self.fs: fsspec.AbstractFileSystem = fs
        self.root = root.rstrip("/")
        # A local directory is made on the first write (not here: a gateway that serves no
        # files must start where its default folder cannot be made).
        self.local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def open(self, name: str, mode: str = "rb") -> IO[bytes]:
        if self.local and "w" in mode:
            self._private(self.path(name))
        handle: IO[bytes] = self.fs.open(self.path(name), mode)
        return handle

    def _private(self, path: str) -> None:
        """Make ``path``'s folder (0700) and the file itself with mode 0600 before fsspec
        opens it: its writer truncates an existing file and keeps its mode."""
        parent = path.rsplit("/", 1)[0]
        os.makedirs(parent, mode=DIR_MODE, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)  # a file written before (by an older version)
        finally:
            os.close(fd)

    def write_lines(self, name: str, lines: Iterable[bytes]) -> int:
        """Replace ``name`` with these lines (each ends with a newline); the byte count."""
        size = 0
        with self.open(name, "wb") as out:
            for line in lines:
                out.write(line)
                size += len(line)
        return size

    def copy_from(self, name: str, source: IO[bytes], max_bytes: int) -> int | None:
        """Stream ``source`` into ``name``; None (and nothing stored) when it exceeds
        ``max_bytes``."""
        size = 0
        with self.open(name, "wb") as out:
            while block := source.read(BLOCK):
                size += len(block)
                if size > max_bytes:
                    break
                out.write(block)
        if size > max_bytes:
            self.delete(name)
            return None
        return size

    def concat(self, target: str, parts: Iterable[str]) -> int:
        """Stream the parts, in order, into ``target`` (missing parts are empty)."""
        size = 0
        with self.open(target, "wb") as out:
            for part in parts:
                if not self.fs.exists(self.path(part)):
                    continue
                with self.open(part) as src:
                    while block := src.read(BLOCK):
                        out.write(block)
                        size += len(block)
        return size

    def blocks(self, name: str, offset: int = 0) -> Iterator[bytes]:
        with self.open(name) as src:
            if offset:
                src.seek(offset)
            while block := src.read(BLOCK):
                yield block

    def delete(self, name: str) -> None:
        path = self.path(name)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))
