"""The Lua scripts against their single sources, without a server: each script's header
(KEYS/ARGV) against the ``ops`` call that builds its input, the field names of request hashes
and streams against ``inferq.protocol.fields``, the results the scripts write against
``codec.Result``, and the package data against the script files."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest

import inferq
from inferq.errors import CRASHED_WORKER, MAX_ATTEMPTS, MODEL_ERROR, InferqError
from inferq.protocol import fields, ops, scripts
from inferq.protocol.codec import RESULT_FIELDS, ErrorInfo, Status
from inferq.protocol.keys import QueueKeys

ROOT = Path(inferq.__file__).parent
LUA = ROOT / "protocol" / "lua"
KEYS = QueueKeys.for_model("embed", "m")
#: The shard-wide keys a script may declare, by the ``QueueKeys`` attribute that names them.
SHARD_KEYS = {getattr(KEYS, name): name for name in (
    "pending", "inflight", "started", "leases", "seq", "wake", "delayed", "dead", "dead_letters",
    "workers", "conns", "stats", "fair")}

def completion(request_id: str, token: str, status: str, body: bytes) -> ops.Completion:
    return ops.Completion(ops.Claimed(request_id, b"", token, 1, 0, None), status, body)



@dataclass
class Header:
    keys: list[str]
    #: Fixed arguments: (index, name).
    fixed: list[tuple[int, str]]
    #: ``rows of W`` (flat, from index ``rows_from`` to the end) or ``packed rows of W``.
    rows_from: int | None = None
    packed_at: int | None = None
    width: int = 0
    row_names: tuple[str, ...] = ()
    optional: str | None = None


def parse_header(name: str) -> Header:
    text = (LUA / f"{name}.lua").read_text()
    block = re.match(r"--\[\[(.*?)\]\]", text, re.S)
    assert block, f"{name}.lua does not open with a --[[ header ]]"
    section = block.group(1).split("Input:")[1].split("\n\n")[0]
    header = Header([], [])
    for line in section.strip().splitlines():
        line = line.strip()
        if m := re.fullmatch(r"KEYS\[(\d+)\] (\w+).*", line):
            assert int(m.group(1)) == len(header.keys) + 1, f"{name}: {line}"
            header.keys.append(m.group(2))
        elif m := re.fullmatch(r"ARGV\[(\d+)\] packed rows of (\d+): (.+)", line):
            header.packed_at, header.width = int(m.group(1)), int(m.group(2))
            header.row_names = tuple(n.strip() for n in m.group(3).split(","))
            header.fixed.append((int(m.group(1)), "packed"))
        elif m := re.fullmatch(r"ARGV\[(\d+)\.\.\] rows of (\d+): (.+)", line):
            header.rows_from, header.width = int(m.group(1)), int(m.group(2))
            header.row_names = tuple(n.strip() for n in m.group(3).split(","))
        elif m := re.fullmatch(r"ARGV\[last\] optional: (\w+)", line):
            header.optional = m.group(1)
        elif m := re.fullmatch(r"ARGV\[(\d+)\] (\w+).*", line):
            header.fixed.append((int(m.group(1)), m.group(2)))
        else:
            raise AssertionError(f"{name}.lua: unreadable header line {line!r}")
    assert [i for i, _ in header.fixed] == list(range(1, len(header.fixed) + 1)), name
    assert len(header.row_names) == header.width, f"{name}: {header.width} names per row"
    return header


def item(i: int) -> ops.EnqueueItem:
    return ops.EnqueueItem(f"r{i}", 0, b"payload", None, 3)


LEASES = [("r1", "t1"), ("r2", "t2"), ("r3", "t3")]
#: Each script's ops call, for n rows (n = 1..3).
CALLS: dict[str, Callable[[int], ops.Call]] = {
    "enqueue": lambda n: ops.enqueue_call(KEYS, [item(i) for i in range(n)]),
    "claim": lambda n: ops.claim_call(KEYS, "w", 1000, 10, 60_000),
    "peek": lambda n: ops.peek_call(KEYS),
    "start": lambda n: ops.start_call(KEYS, LEASES[:n]),
    "heartbeat": lambda n: ops.heartbeat_call(KEYS, "w", 1000, 3000, LEASES[:n]),
    "complete": lambda n: ops.complete_call(
        KEYS, 60_000, 100, [completion(f"r{i}", "t", "ok", b"body") for i in range(n)]),
    "reclaim": lambda n: ops.reclaim_call(KEYS, 500, 60_000, 100, max_crashes=2, grace_ms=250,
                                          probe_ms=125,
                                          connected=[f"w{i}" for i in range(n)]),
    "release": lambda n: ops.release_call(KEYS, LEASES[:n]),
    "cancel": lambda n: ops.cancel_call(KEYS, "r1", 60_000),
    "stream": lambda n: ops.stream_call(
        KEYS, 60_000, [ops.StreamDelta(f"r{i}", "t", 1, "text", (1, 2)) for i in range(n)]),
    "stream_end": lambda n: ops.stream_end_call(KEYS, 60_000, [f"r{i}" for i in range(n)]),
    "requeue": lambda n: ops.requeue_call(KEYS, [f"r{i}" for i in range(n)]),
    "purge": lambda n: ops.purge_call(KEYS, [f"r{i}" for i in range(n)]),
    "hold": lambda n: ops.hold_call(KEYS, "w", 1000, [f"{i:016x}" for i in range(n)]),
}


def test_every_script_has_a_file_a_header_and_an_ops_call() -> None:
    files = {p.stem for p in LUA.glob("*.lua")}
    assert files == set(scripts.NAMES) == set(CALLS) == set(scripts.ALL)


@pytest.mark.parametrize("name", scripts.NAMES)
def test_the_header_matches_the_ops_call(name: str) -> None:
    header = parse_header(name)
    for n in (1, 3):
        keys, args = CALLS[name](n)
        assert [SHARD_KEYS.get(str(k), k) for k in keys] == header.keys, \
            f"{name}.lua declares KEYS {header.keys}; ops builds {keys}"
        fixed = len(header.fixed)
        rows = 0 if header.rows_from is None else n * header.width
        assert len(args) == fixed + rows, f"{name}: {len(args)} ARGV, header says {fixed} + {rows}"
        if header.rows_from is not None:
            assert header.rows_from == fixed + 1, f"{name}: rows must follow the fixed arguments"
        if header.packed_at is not None:
            packed = msgpack.unpackb(args[header.packed_at - 1], raw=False)
            assert len(packed) == n * header.width, f"{name}: packed rows of {header.width}"
        for i, arg_name in header.fixed:
            if arg_name == "prefix":
                assert args[i - 1] == KEYS.prefix, f"{name}: ARGV[{i}] is the prefix"
    if header.optional is not None:  # enqueue's 'atomic'
        keys, args = ops.enqueue_call(KEYS, [item(0)], atomic=True)
        rows = 0 if header.rows_from is None else header.width
        assert args[-1] == header.optional and len(args) == len(header.fixed) + rows + 1


@pytest.mark.parametrize("name", scripts.NAMES)
def test_the_body_uses_only_what_the_header_declares(name: str) -> None:
    header = parse_header(name)
    body = (LUA / f"{name}.lua").read_text().split("]]", 1)[1]
    used_keys = {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body)}
    # every declared key is used, but the first may only name the shard's slot
    assert set(range(2, len(header.keys) + 1)) <= used_keys <= set(
        range(1, len(header.keys) + 1)), f"{name}: KEYS used {used_keys}"
    used_args = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body)}
    last = len(header.fixed) + (1 if header.optional and header.packed_at else 0)
    assert used_args <= set(range(1, last + 1)), f"{name}: ARGV used {used_args}"


# ---------------------------------------------------------------------------- field names

HASH_CODES = {f.value for f in fields.Field}
STREAM_CODES = {f.value for f in fields.StreamField}
#: Python literals equal to a code that are not field names: (path under inferq/, literal).
#: Literals that equal a field's name but are not one: (module, literal).
NOT_FIELDS = {
    # the resumable SSE stream's tail event ids (<entry>:f, :u, :d: finish, usage, [DONE])
    ("gateway/sse.py", "d"),
}


def _lua_literals(text: str) -> set[str]:
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.S)
    text = re.sub(r"--[^\n]*", "", text)
    return set(re.findall(r"'([^'\\]*)'", text)) | set(re.findall(r'"([^"\\]*)"', text))


def test_no_script_spells_a_field_name() -> None:
    for path in sorted(LUA.rglob("*.lua")):
        found = _lua_literals(path.read_text()) & (HASH_CODES | STREAM_CODES)
        assert not found, (f"{path.name} spells the field(s) {sorted(found)}: use the F_ / SF_ "
                           "constants generated from inferq/protocol/fields.py")


def _python_literals(tree: ast.AST) -> set[str]:
    """String constants, but not the parts of f-strings or the mode of ``open()``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
            skip.update(id(a) for a in node.args[1:])
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in skip}


def test_no_python_module_spells_a_field_name() -> None:
    for path in sorted(ROOT.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        if where == "protocol/fields.py":
            continue
        found = {c for c in _python_literals(ast.parse(path.read_text()))
                 & (HASH_CODES | STREAM_CODES) if (where, c) not in NOT_FIELDS}
        assert not found, (f"{where} spells the field(s) {sorted(found)}: use "
                           "inferq.protocol.fields")


def test_the_scripts_get_every_name_from_its_source() -> None:
    prelude = scripts.constants()
    for enum, prefix in ((fields.Field, "F_"), (fields.HashState, "STATE_"),
                         (fields.StreamField, "SF_")):
        for member in enum:
            assert re.search(rf"\b{prefix}{member.name}\b", prelude)
    assert all(source.startswith(prelude) for source in scripts.ALL.values())


# ---------------------------------------------------------------------------- results

def test_the_scripts_results_are_results() -> None:
    """What Lua's ``error_result`` writes: only ``Result`` fields (and ``ErrorInfo``'s inside
    ``error``), the statuses and error codes Python knows. Its output is decoded by
    ``codec.Result`` in tests/integration/test_protocol.py."""
    source = (LUA / "includes" / "results.lua").read_text()
    body = source[source.index("function error_result"):]
    table = body[body.index("cmsgpack.pack({") + len("cmsgpack.pack({"):body.index("})")]
    error = re.search(r"error = \{(.*?)\}", table, re.S)
    assert error is not None
    outer = set(re.findall(r"(\w+) =", table.replace(error.group(0), "error = x")))
    assert outer <= set(RESULT_FIELDS) and {"v", "id", "status"} <= outer, outer
    assert set(re.findall(r"(\w+) =", error.group(1))) <= set(ErrorInfo.model_fields)
    statuses = set(re.findall(r"error_result\(\s*\w+,\s*'(\w+)'",
                              "".join(p.read_text() for p in LUA.rglob("*.lua"))))
    assert statuses and statuses <= {s.value for s in Status}
    codes = set(re.findall(r"error_result\(\s*\w+,\s*'\w+',\s*'(\w+)'",
                           "".join(p.read_text() for p in LUA.rglob("*.lua"))))
    known = {cls.code for cls in _subclasses(InferqError)} | {MODEL_ERROR, MAX_ATTEMPTS,
                                                              CRASHED_WORKER}
    assert codes and codes <= known, codes - known


def _subclasses(cls: type[Any]) -> list[type[Any]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


# ---------------------------------------------------------------------------- packaging

def test_the_package_ships_every_script_file() -> None:
    config = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["inferq.protocol"]
    shipped = {p for pattern in patterns for p in (ROOT / "protocol").glob(pattern)}
    assert shipped == set(LUA.rglob("*.lua"))


def test_includes_are_put_in_once_before_their_users() -> None:
    complete = scripts.ALL["complete"]
    assert complete.count("local function force(") == 1  # included by two helpers
    assert complete.index("local function force(") < complete.index("local function put_result(")
    assert "local function put_result(" not in scripts.ALL["start"]  # only what it includes
