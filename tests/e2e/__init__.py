"""End-to-end tests: real ``inferq worker`` processes, the CLI and the gateway as a user runs
them (subprocesses), real models (MiniLM, SmolLM2, the tiny Llama on disk), the chaos run.
Every test here carries the ``e2e`` marker."""
