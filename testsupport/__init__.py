"""Support the tests and the benchmarks share: real servers on loopback and the model zoo (not shipped)."""
