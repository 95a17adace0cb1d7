"""Models a worker can serve: a real HF embedding model and the built-in echo/sleep models."""
