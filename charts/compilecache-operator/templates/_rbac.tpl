{{/* Rules on namespaced objects: a ClusterRole when watching every namespace, else a Role in the watched one. */}}
{{- define "compilecache-operator.namespacedRules" -}}
# The CompileCaches themselves: Kopf lists/watches them and patches metadata (finalizer, progress
# annotations); spec is never written.
- apiGroups: ["compilecache.io"]
  resources: ["compilecaches"]
  verbs: ["get", "list", "watch", "patch", "update"]
# Status: conditions, observedGeneration and the published bundles.
- apiGroups: ["compilecache.io"]
  resources: ["compilecaches/status"]
  verbs: ["get", "patch", "update"]
# Warm-up Jobs: one per missing variant, created if absent, read for results, deleted on re-plan.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Pods: warm-up Job pods and injected workload pods are watched to read preload/publish results from their
# termination messages; patched once to mark a result as counted.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# Events: Kopf reports handler progress and errors on the objects it handles.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
