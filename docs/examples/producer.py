"""Enqueue, wait, read the results: the SDK against a running worker.

Start a worker first (echo is a built-in model without weights), then run this script:

    inferq worker --model echo=builtin:echo
    python producer.py
"""

import inferq

client = inferq.Client()  # $INFERQ_REDIS_URL, else redis://localhost:6379/0

# One request: it waits in Redis until a worker takes it, then its result is written.
handle = client.enqueue("The cat sat on the mat.", model="echo", task="embed", priority=5)
result = handle.result(timeout=30)  # blocks in Redis, no polling
print(result.status, result.output, result.queue_wait_ms, result.batch_size)

# Many requests, one call; their results in the order of the handles.
handles = client.enqueue_many(["one", {"prompt": "two", "priority": 9}], model="echo")
for r in client.results(handles, timeout=30):  # failures are returned, not raised
    print(r.ok, r.output)

print(handle.status())  # ok (RequestState.OK)
client.close()
