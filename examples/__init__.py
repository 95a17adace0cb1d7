"""Examples: serve your own model with
``inferq worker --model NAME=python:examples.MODULE:Class``."""
