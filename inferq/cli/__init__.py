"""The ``inferq`` command: worker, stats, enqueue, demo."""
