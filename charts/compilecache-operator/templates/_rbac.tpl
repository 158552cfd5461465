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
# Owned children: Jobs carry an ownerReference with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin (where enabled) only allows with update on the owner's finalizers.
- apiGroups: ["compilecache.io"]
  resources: ["compilecaches/finalizers"]
  verbs: ["update"]
# Warm-up Jobs: one per missing variant, created if absent, read for results, annotated once their result is
# recorded, deleted on re-plan.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
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
