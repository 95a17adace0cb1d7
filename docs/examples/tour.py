"""README's 30-second tour: one request through the SDK, one through the gateway with the
official ``openai`` client; the same worker answers both. README shows how to start the worker
and the gateway, and ``tests/e2e/test_readme_tour.py`` runs it all as README says.
"""

from openai import OpenAI

import inferq

# The SDK: enqueue into Redis, wait for the result a worker writes.
client = inferq.Client()  # $INFERQ_REDIS_URL, else redis://localhost:6379/0
handle = client.enqueue("The cat sat on the mat.", model="minilm", priority=5)
result = handle.result(timeout=60)  # blocks in Redis until a worker has answered
print("sdk", len(result.output), [round(x, 4) for x in result.output[:3]])

# The gateway: OpenAI's embeddings API, queued into the same Redis, answered by the same worker.
gateway = OpenAI()  # $OPENAI_BASE_URL (the gateway's /v1) and $OPENAI_API_KEY (an inferq key)
reply = gateway.embeddings.create(model="minilm", input="The cat sat on the mat.")
vector = reply.data[0].embedding
print("gateway", len(vector), [round(x, 4) for x in vector[:3]])
