"""The batch machinery's pieces that need no Redis: the file store's modes and the reading of
a batch's input line by line, in bounded memory."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

from inferq.batch.store import FileStore


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_stored_files_are_private_to_the_gateway_user(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path / "store"))
    store.write_lines("files/a", [b"x\n"])
    assert store.copy_from("files/b", io.BytesIO(b"abc"), 10) == 3
    store.concat("files/c", ["files/a", "files/b"])
    (tmp_path / "store" / "files" / "old").write_bytes(b"written by an older version")
    os.chmod(tmp_path / "store" / "files" / "old", 0o644)
    store.write_lines("files/old", [b"y\n"])  # rewritten: its mode too
    for name in ("a", "b", "c", "old"):
        assert mode_of(tmp_path / "store" / "files" / name) == 0o600, name
    assert mode_of(tmp_path / "store" / "files") == 0o700
    assert b"".join(store.blocks("files/c")) == b"x\nabc"
