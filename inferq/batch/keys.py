"""Key names of batches and files.

A batch's own keys (its hash, its lines hash and its reply inbox) live on shard 0 of its
queue, under that shard's hash tag: the scripts that withdraw its lines, drain its inbox and
advance its counters each touch one slot. Its lines are queued on shard 0 too (a sharded
queue's workers claim across shards by priority, so they are served all the same). The
indexes (which batches exist, which are active, which files exist, and each tenant's files
and batches) have a tag of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferq.protocol.keys import DEFAULT_NAMESPACE, QueueKeys


def inbox_name(batch_id: str) -> str:
    """The ``reply_to`` of a batch's lines: results are pushed to ``<prefix>inbox:<this>``."""
    return f"batch.{batch_id}"


@dataclass(frozen=True, slots=True)
class BatchKeys:
    batch_id: str
    queue: QueueKeys

    @classmethod
    def of(cls, batch_id: str, task: str, model: str,
           namespace: str = DEFAULT_NAMESPACE) -> BatchKeys:
        return cls(batch_id, QueueKeys.for_model(task, model, namespace).for_shard(0))

    @property
    def batch(self) -> str:
        """Hash of the batch (``fields.BatchField``)."""
        return f"{self.queue.prefix}batch:{self.batch_id}"

    @property
    def lines(self) -> str:
        """Hash: line request id -> JSON ``[custom_id, base64?, estimated tokens]``."""
        return f"{self.queue.prefix}batch:{self.batch_id}:lines"

    @property
    def inbox(self) -> str:
        return self.queue.inbox(inbox_name(self.batch_id))


@dataclass(frozen=True, slots=True)
class Index:
    """The global indexes of one namespace (one slot)."""

    namespace: str = DEFAULT_NAMESPACE

    @property
    def _tag(self) -> str:
        return f"{self.namespace}:{{batches}}:"

    @property
    def batches(self) -> str:
        """Sorted set: batch id -> creation order (ms)."""
        return self._tag + "index"

    @property
    def where(self) -> str:
        """Hash: batch id -> its queue (``task:model``)."""
        return self._tag + "where"

    @property
    def active(self) -> str:
        """Set of the batches not yet in a terminal state (what the runners work on)."""
        return self._tag + "active"

    @property
    def wake(self) -> str:
        """List a runner blocks on: pushed when a batch is created or cancelled."""
        return self._tag + "wake"

    @property
    def files(self) -> str:
        """Sorted set: file id -> creation order (ms)."""
        return self._tag + "files"

    def files_of(self, tenant: str) -> str:
        """Sorted set: ``tenant``'s file ids -> creation order (ms); the list a tenant sees."""
        return f"{self._tag}files:by:{tenant}"

    def batches_of(self, tenant: str) -> str:
        """Sorted set: ``tenant``'s batch ids -> creation order (ms)."""
        return f"{self._tag}index:by:{tenant}"

    def file(self, file_id: str) -> str:
        """Hash of one file's metadata."""
        return f"{self._tag}file:{file_id}"
