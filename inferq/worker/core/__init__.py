"""What both workers share. ``lifecycle`` (start, serve, drain, stop); ``queue_link`` (every
Redis call on the queue: claims, completions, releases, reclaims, stats, tuning); ``leases``
(the lease book and the heartbeat thread); ``wake`` (blocking on the wake list); ``results``
(claims decoded, completions built, outcomes counted); ``metrics`` (Prometheus, /healthz);
``failures`` (model exceptions as results); ``backoff`` (Redis outages); ``config``.
"""
