"""Admission: the webhooks' answers to the API server (the mutating review of a pod, the validating check).

Imports the model, the decisions, the edge and this package; never the controller."""
