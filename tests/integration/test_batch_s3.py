"""The file store on S3 (``s3://bucket/prefix`` through s3fs) against a real S3 API server:
moto's server mode, started by the test. A batch's input, parts and output live in the
bucket; its metadata in Redis."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from inferq.embedded import free_port
from tests.support.batch import answer, embed_line, jsonl, read_jsonl, wait_status
from tests.support.gateway import MakeApi
from tests.support.processes import wait_until

pytest.importorskip("s3fs", reason="the s3:// file store needs s3fs (pip install s3fs)")
pytest.importorskip("moto.server", reason="the S3 API server is moto's (pip install "
                                          "'moto[server]')")
boto3 = pytest.importorskip("boto3")

BUCKET = "inferq-batches"


@pytest.fixture(scope="module")
def s3_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                httpx.get(url)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_a_batch_on_an_s3_file_store(make_api: MakeApi, r: redis.Redis, s3_url: str,
                                     tmp_path: Path) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_url, aws_access_key_id="test",
                      aws_secret_access_key="test", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    options = {"key": "test", "secret": "test", "endpoint_url": s3_url,
               "client_kwargs": {"region_name": "us-east-1"}}
    with make_api(file_store=f"s3://{BUCKET}/prod", file_store_options=options,
                  batch_idle_s=0.2) as api:
        data = jsonl([embed_line(f"s{i}", f"text {i}") for i in range(3)])
        upload = api.post("/v1/files", files={"file": ("in.jsonl", data)},
                          data={"purpose": "batch"}).json()
        stored = s3.get_object(Bucket=BUCKET, Key=f"prod/files/{upload['id']}")["Body"].read()
        assert stored == data
        batch = api.post("/v1/batches", json={"input_file_id": upload["id"],
                                              "endpoint": "/v1/embeddings",
                                              "completion_window": "24h"}).json()
        while not answer(r):
            time.sleep(0.05)
        done = wait_status(lambda: api.get(f"/v1/batches/{batch['id']}").json(), "completed")
        output = api.get(f"/v1/files/{done['output_file_id']}/content").content
        assert sorted(line["custom_id"] for line in read_jsonl(output)) == ["s0", "s1", "s2"]

        def keys() -> set[str]:
            listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="prod/")["Contents"]
            return {o["Key"] for o in listed}

        # The parts go once the batch is completed (after, so a redone finalization has them).
        wait_until(lambda: keys() == {f"prod/files/{upload['id']}",
                                      f"prod/files/{done['output_file_id']}"},
                   what="only the input and output left in the bucket")
        assert api.delete(f"/v1/files/{upload['id']}").json()["deleted"] is True
        assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"prod/files/{upload['id']}"
                                  )["KeyCount"] == 0
