"""What the tests at every level share: servers and worker processes they start, the tiny
model, the gateway app, in-process workers, property-test counters. Fixtures are not defined
here: the conftest.py files define them and take their machinery from this package."""
