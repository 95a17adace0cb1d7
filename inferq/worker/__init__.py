"""The worker: claims requests from a queue, runs them through a model, writes each result.

* ``core/``: what both workers share: the lifecycle, claims and results, leases and the
  heartbeat, wake-ups, and every Redis call on the queue (``core/queue_link.py``);
* ``window/``: the window worker (whole batches; the batching window is ``window/policy.py``);
* ``generate/``: the generate worker (continuous batching: the decode step is
  ``generate/engine.py``, the stream publisher ``generate/publisher.py``);
* ``models/``: the model adapters, loaded by ``models/registry.py``.

Redis key names live in ``inferq/protocol/keys.py``, the Lua scripts in
``inferq/protocol/scripts.py`` (their arguments and replies in ``inferq/protocol/ops.py``).
Real models need ``inferq[worker]`` (torch, transformers); the built-in ``echo`` and ``sleep``
models run without them.
"""
