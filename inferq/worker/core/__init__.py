"""What both workers share. ``lifecycle`` (start, serve, drain, stop); ``queue_link`` (every
Redis call on the queue: claims, completions, releases, reclaims, stats, tuning); ``leases``
(the lease book and the heartbeat thread); ``wake`` (the wake list); ``results`` (claims
decoded, completions built); ``stats`` and ``metrics`` (what is counted and exported);
``failures`` (model exceptions as results); ``backoff`` (Redis outages); ``config``.
"""
