"""Every peer the ``overhead`` scenario can run, by name (its ``--baselines``)."""

from __future__ import annotations

from benchmarks import peers
from benchmarks.peers.arq_peer import Arq
from benchmarks.peers.bullmq_peer import BullMQ, BullMQNode
from benchmarks.peers.peer import Peer
from benchmarks.peers.rq_peer import Rq
from benchmarks.peers.saq_peer import Saq

_C = peers.CONCURRENCY
PEERS: dict[str, Peer] = {p.name: p for p in (
    Arq("arq-default", tuned=False), Arq("arq-tuned", tuned=True),
    Rq("rq", simple=False), Rq("rq-simple", simple=True),
    BullMQ("bullmq", f"BullMQ (Python port), concurrency {_C}, pooled redis-py connection"),
    BullMQ("bullmq-url", f"BullMQ (Python port), concurrency {_C}, given a URL (its default "
                         "single connection)", pooled=False),
    BullMQNode("bullmq-node", f"BullMQ on Node.js, concurrency {_C}"),
    Saq("saq", f"SAQ, concurrency {_C}"))}
