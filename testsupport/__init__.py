"""Support the tests and the benchmarks share (not shipped): real servers on loopback, a local Kubernetes
control plane, the model zoo."""
