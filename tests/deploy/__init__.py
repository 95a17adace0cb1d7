"""Deployment checks: the compose files, the Dockerfile and .dockerignore, the worker
healthcheck, and the Prometheus and Grafana provisioning, read by parsing them (no Docker
engine here). One test runs ``redis-server`` on the compose command line."""
