"""Test infrastructure: a local Kubernetes control plane, a real node, our images, Prometheus and helm."""
