"""What runs inside the user's image: the warm-up harness and the modules it and a workload's warm start use.

The standard library and torch (with Triton) only: the warm-up Job copies these files beside the harness
(the operator's ``COPY_HARNESS``), and the image has nothing else (tests/test_layering.py checks it)."""
