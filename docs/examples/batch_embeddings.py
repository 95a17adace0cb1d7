"""A batch job through OpenAI's Files and Batches APIs, with the official ``openai`` client.

    inferq worker --model minilm
    INFERQ_GATEWAY_TOKEN=secret inferq gateway --port 8000
    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=secret python batch_embeddings.py
"""

import json
import time

from openai import OpenAI

client = OpenAI()  # $OPENAI_BASE_URL (the gateway's /v1) and $OPENAI_API_KEY
lines = [json.dumps({"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/embeddings",
                     "body": {"model": "minilm", "input": text}})
         for i, text in enumerate(["The cat sat on the mat.", "A durable queue.", "héllo"])]
batch_file = client.files.create(file=("requests.jsonl", "\n".join(lines).encode()),
                                 purpose="batch")
batch = client.batches.create(input_file_id=batch_file.id, endpoint="/v1/embeddings",
                              completion_window="24h", metadata={"job": "docs"})
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    time.sleep(1)
    batch = client.batches.retrieve(batch.id)
print(batch.status, batch.request_counts)
assert batch.output_file_id is not None
for line in client.files.content(batch.output_file_id).text.splitlines():
    row = json.loads(line)  # in the order the lines finished: match them by custom_id
    print(row["custom_id"], row["response"]["status_code"],
          len(row["response"]["body"]["data"][0]["embedding"]))
