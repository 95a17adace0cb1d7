"""The worker: claims requests from a queue, runs them through a model, writes each result.

* ``core/``: what both workers share: the lifecycle, every Redis call on the queue (claims,
  completions: ``core/queue_link.py``), leases and the heartbeat (``core/leases.py``), results;
* ``window/``: the window worker (whole batches; the batching window: ``window/policy.py``);
* ``generate/``: the generate worker (continuous batching; the decode step:
  ``generate/engine.py``; the stream publisher: ``generate/publisher.py``);
* ``models/``: the model adapters, loaded by ``models/registry.py``.

Redis keys are named in ``inferq/protocol/keys.py``, the Lua scripts are
``inferq/protocol/lua/`` (loaded by ``inferq/protocol/scripts.py``). Real models need
``inferq[worker]`` (torch, transformers).
"""
