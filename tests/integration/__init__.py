"""Integration tests: a real Redis-compatible server started by the test run (or servers with
passwords, ACL users or TLS started here), with the SDK, workers and the gateway in-process.
No subprocesses: a test that starts a worker process or runs the CLI belongs in ``tests/e2e``."""
