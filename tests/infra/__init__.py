"""Test infrastructure: a local Kubernetes control plane and a node agent that runs pods as processes."""
