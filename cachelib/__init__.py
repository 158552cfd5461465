"""compilecache's cache library: keys, the bundle format, stores, the warm-up harness,
the preloader and the runtime counters. Nothing here knows about Kubernetes."""

__version__ = "0.1.0"
