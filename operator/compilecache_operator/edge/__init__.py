"""The edge: I/O with the cluster and the outside (API client and login, leader election, watches, Events,
certificates, signing key, store, metrics, probes). Imports the model, the decisions and this package."""
