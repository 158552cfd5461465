"""The model: the checked spec, its parse and the words every room shares.

Pure: imports the standard library, cachelib and this package only; no I/O, no Kubernetes client, no Kopf."""
