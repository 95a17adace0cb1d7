"""Persist the adaptive window's learned state per (queue, model), so a restarted worker
resumes tuned instead of learning the latency model and arrival rate again."""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as aioredis

from inferq.protocol.keys import QueueKeys
from inferq.worker.policy import WindowConfig, WindowPolicy

log = logging.getLogger("inferq.worker")
TUNING_TTL_S = 7 * 24 * 3600


async def load_policy(client: aioredis.Redis, keys: QueueKeys, model_id: str,
                      config: WindowConfig) -> tuple[WindowPolicy, bool]:
    """The persisted policy, or a fresh one; the flag says whether state was resumed."""
    raw = await client.hget(keys.tuning(model_id), "state")
    if raw is None:
        return WindowPolicy(config), False
    try:
        state: dict[str, Any] = json.loads(raw)
    except ValueError:
        log.warning("ignoring unreadable tuning state at %s", keys.tuning(model_id))
        return WindowPolicy(config), False
    return WindowPolicy.from_state(config, state), True


async def save_policy(client: aioredis.Redis, keys: QueueKeys, model_id: str,
                      policy: WindowPolicy) -> None:
    key = keys.tuning(model_id)
    pipe = client.pipeline(transaction=False)
    pipe.hset(key, "state", json.dumps(policy.to_state()))
    pipe.expire(key, TUNING_TTL_S)
    await pipe.execute()
