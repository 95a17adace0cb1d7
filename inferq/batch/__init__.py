"""Batch jobs on the durable queue: OpenAI's Files and Batches APIs (served by the gateway).

A batch is a JSONL file of requests to one endpoint and one model. Every line becomes one
queue request, at a low priority band, with its deadline at the end of the completion window;
its id is derived from the batch id and the line's ``custom_id``, so ingesting a line twice
queues it once. Results come back through the batch's own reply inbox (a Redis list the
complete script pushes to), and are appended to the output and error files in numbered parts.

All of a batch's state lives in Redis (the batch hash and its lines hash, on shard 0 of its
queue, so one script sees the hash, the queue and the inbox) and in the file store (fsspec: a
local directory or ``s3://``). The work (ingestion, draining results, finalization) is done by
any gateway process that holds the batch's lease; every step commits through one atomic
script that checks the lease token and the step's expected position, so a gateway killed at
any point leaves a state the next holder continues from, losing and duplicating nothing.
"""
