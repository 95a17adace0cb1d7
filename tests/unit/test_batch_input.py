"""The batch machinery's pieces that need no Redis: the file store's modes and the reading of
a batch's input line by line, in bounded memory."""

from __future__ import annotations

import io
import json
import os
import stat
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferq.batch.envelope import FileInvalid, check_file, read_lines
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


def blocks_of(parts: list[bytes], size: int, read: list[int]) -> Iterator[bytes]:
    """``parts`` joined, in blocks of ``size`` bytes made as they are read (``read`` counts
    the bytes handed out): a file that is never all in memory."""
    for part in parts:
        for start in range(0, len(part), size):
            block = part[start:start + size]
            read[0] += len(block)
            yield block


def test_a_huge_single_line_is_refused_in_bounded_memory() -> None:
    limit = 64 << 10
    read = [0]
    huge = b"x" * (20 << 20)  # 20 MiB, one line (made once, before the measure)
    tracemalloc.start()
    try:
        with pytest.raises(FileInvalid) as refused:
            check_file(blocks_of([huge], 4096, read), "/v1/embeddings", 10, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.line == 1 and refused.value.code == "line_too_long"
    assert f"{limit} bytes" in refused.value.message
    assert read[0] <= limit + 4096  # it stopped reading at the limit
    assert peak < 4 * limit


def test_the_line_limit_names_the_line_and_admits_a_line_at_the_limit() -> None:
    good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "echo", "input": "x"}}).encode()
    limit = len(good)
    padded = good[:-1] + b" " * 10 + b"}"
    for size in (1, 7, 4096):
        assert check_file(blocks_of([good + b"\n", good.replace(b'"a"', b'"b"')], size,
                                    [0]), "/v1/embeddings", 10, limit) == (2, "echo")
        with pytest.raises(FileInvalid) as refused:
            check_file(blocks_of([good + b"\n", padded + b"\n", good + b"\n"], size, [0]),
                       "/v1/embeddings", 10, limit)
        assert refused.value.line == 2 and refused.value.code == "line_too_long"
    # the offsets of the lines read are unchanged by the limit
    assert list(read_lines([b"ab\ncd\n", b"e"], max_line=2)) == [
        (3, b"ab"), (6, b"cd"), (7, b"e")]
