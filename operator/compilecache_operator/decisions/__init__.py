"""The decisions: what to create, patch or write, decided from the model and what was read.

Pure: imports the standard library, cachelib, the model and this package only; the caller does the I/O."""
