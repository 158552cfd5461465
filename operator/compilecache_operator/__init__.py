"""compilecache's Kubernetes operator: rooms whose ``__init__`` states its rule, and the top that joins them.

``model`` and ``decisions`` are pure; ``edge`` does the I/O; ``controller`` and ``admission`` use the three; ``main``,
``lifecycle``, ``handlers`` and ``startupcheck`` join the rooms (docs/operator.md; tests/test_layering.py checks it)."""
