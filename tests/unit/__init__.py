"""Unit tests: no server and no subprocess; fakeredis, stand-ins and the tiny random model
(in-process) are allowed. A test that needs a real server belongs in ``tests/integration``."""
