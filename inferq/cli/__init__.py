"""The ``inferq`` command: one module per command, each adding its own parser.

``main`` (entry point, dispatch, one-line errors) · ``options`` (``--redis-url``/``--tls-*``,
shared) · ``worker`` · ``stats`` · ``enqueue`` · ``gateway`` · ``convert`` (``convert-smollm2``)
· ``demo``.
"""
