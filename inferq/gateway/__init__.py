"""The HTTP gateway (``pip install 'inferq[gateway]'``): OpenAI-compatible ``/v1/embeddings``,
``/v1/completions`` and ``/v1/chat/completions`` (with server-sent event streaming), and
inferq's native ``/v1/requests``, over one shared ``AsyncClient``.

    python -m inferq.gateway --host 0.0.0.0 --port 8000   # INFERQ_REDIS_URL, INFERQ_GATEWAY_*
"""

from __future__ import annotations

from inferq.gateway.app import create_app
from inferq.gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "create_app"]
