"""The fields of a batch's Redis hash (``BatchKeys.batch``): the one source for Python and for
the batch scripts (``lua/batch/*.lua``, where they are ``B_<NAME>`` constants)."""

from __future__ import annotations

from enum import StrEnum


class BatchField(StrEnum):
    STATUS = "status"
    #: The terminal status a finalizing batch will have (completed, cancelled or expired).
    FINAL_STATUS = "final_status"
    ENDPOINT = "endpoint"
    MODEL = "model"
    TASK = "task"
    INPUT_FILE_ID = "input_file_id"
    COMPLETION_WINDOW = "completion_window"
    METADATA = "metadata"
    PRIORITY = "priority"
    #: The tenant of the principal that created the batch ('' for the operator): it owns the
    #: batch and its output files, and its lines run as its requests (fair share, ids).
    OWNER = "owner"
    #: The creating key's ceiling on priority ('' for none): the runner's lines never exceed
    #: it, whichever gateway runs them.
    MAX_PRIORITY = "max_priority"
    #: The creating key's per-tenant limits, ``"<requests/min> <tokens/min> <in flight>
    #: <queued bytes>"`` (0: none; absent: none): its lines are admitted under them, sharing
    #: the tenant's buckets with its online calls (``inferq.batch.limits``).
    LIMITS = "limits"
    #: The W3C trace context of the call that created the batch ('' for none): each line's
    #: request carries it (docs/guides/tracing.md).
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"
    OUTPUT_FILE_ID = "output_file_id"
    ERROR_FILE_ID = "error_file_id"
    ERRORS = "errors"
    # timestamps (unix seconds)
    CREATED_AT = "created_at"
    IN_PROGRESS_AT = "in_progress_at"
    EXPIRES_AT = "expires_at"
    FINALIZING_AT = "finalizing_at"
    COMPLETED_AT = "completed_at"
    FAILED_AT = "failed_at"
    EXPIRED_AT = "expired_at"
    CANCELLING_AT = "cancelling_at"
    CANCELLED_AT = "cancelled_at"
    # progress
    #: Lines in the input file.
    TOTAL = "total"
    #: Lines ingested so far (queued, or written to the error file as invalid / expired).
    CURSOR = "cursor"
    #: The input file's byte offset of line ``CURSOR``.
    OFFSET = "offset"
    #: Lines refused at ingestion (4xx in the error file).
    INVALID = "invalid"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    #: Lines withdrawn from the queue by a cancel (they never ran and are in no file).
    WITHDRAWN = "withdrawn"
    #: 1 once the withdraw pass of a cancel or an expiry has run to its end.
    SWEPT = "swept"
    #: Parts written to the file store (``part-<n>.out`` / ``part-<n>.err``).
    PARTS = "parts"
    # the lease
    LEASE_TOKEN = "lease_token"
    LEASE_UNTIL = "lease_until"


def lua_constants() -> str:
    names = ", ".join(f"B_{f.name}" for f in BatchField)
    values = ", ".join(f"'{f.value}'" for f in BatchField)
    return f"-- generated from inferq/batch/fields.py\nlocal {names} = {values}\n"
