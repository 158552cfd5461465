{{/* Rules on namespaced objects: a ClusterRole when watching every namespace, else a Role in the watched one. Every
     verb is one the operator's code uses (tests/chart/test_rbac_from_code.py reads the calls from the source). */}}
{{- define "compilecache-operator.namespacedRules" -}}
# The CompileCaches themselves: Kopf lists and watches them, the webhook lists them once at start-up, a pod's cold
# start is tallied into a fresh get; the finalizer compilecache.io/bundles is patched in. Spec is never written
# (rbac.confineWrites checks it at admission).
- apiGroups: ["compilecache.io"]
  resources: ["compilecaches"]
  verbs: ["get", "list", "watch", "patch"]
# Status: conditions, observedGeneration and the published bundles (merge patches).
- apiGroups: ["compilecache.io"]
  resources: ["compilecaches/status"]
  verbs: ["patch"]
# Owned children: Jobs carry an ownerReference with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin (where enabled) only allows with update on the owner's finalizers.
- apiGroups: ["compilecache.io"]
  resources: ["compilecaches/finalizers"]
  verbs: ["update"]
# Warm-up Jobs: one per missing variant, created if absent, watched for results, annotated once their result is
# recorded, deleted on re-plan (rbac.confineWrites: only labelled, restricted warm-ups).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Pods: warm-up Job pods and injected workload pods are watched to read preload/publish results from their
# termination messages; annotated once to mark a result as counted (rbac.confineWrites: compilecache.io/ annotations
# only).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
# Events: Kopf posts the operator's events and handler failures on the objects it handles.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* The API version of ValidatingAdmissionPolicy this cluster serves (v1 from Kubernetes 1.30, v1beta1 where a
     1.29 cluster turned it on), or nothing. */}}
{{- define "compilecache-operator.admissionPolicyAPI" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1beta1/ValidatingAdmissionPolicy" -}}
admissionregistration.k8s.io/v1beta1
{{- end }}
{{- end }}

{{/* Validations of an UPDATE by the operator: labels, owners and every annotation outside compilecache.io/ stay as
     they were; finalizers too, except, with "ownFinalizers", those under compilecache.io/ (its CompileCaches').
     Argument: (list RESOURCE ownFinalizers). */}}
{{- define "compilecache-operator.onlyOwnMetadata" -}}
{{- $what := index . 0 }}
{{- $fields := list "labels" "ownerReferences" }}
{{- if not (index . 1) }}{{ $fields = append $fields "finalizers" }}{{ end }}
{{- range $field := $fields }}
- expression: >-
    request.operation != 'UPDATE' || (has(object.metadata.{{ $field }}) == has(oldObject.metadata.{{ $field }}) &&
    (!has(object.metadata.{{ $field }}) || object.metadata.{{ $field }} == oldObject.metadata.{{ $field }}))
  message: "the compilecache operator may not change the {{ $field }} of {{ $what }}"
{{- end }}
- expression: >-
    request.operation != 'UPDATE' || ((!has(object.metadata.annotations) ||
    object.metadata.annotations.all(k, k.startsWith('compilecache.io/') || (has(oldObject.metadata.annotations) &&
    k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k]))) &&
    (!has(oldObject.metadata.annotations) || oldObject.metadata.annotations.all(k, k.startsWith('compilecache.io/') ||
    (has(object.metadata.annotations) && k in object.metadata.annotations))))
  message: "the compilecache operator may change only compilecache.io/ annotations of {{ $what }}"
{{- if index . 1 }}
- expression: >-
    request.operation != 'UPDATE' || ((!has(object.metadata.finalizers) ||
    object.metadata.finalizers.all(f, f.startsWith('compilecache.io/') || (has(oldObject.metadata.finalizers) &&
    f in oldObject.metadata.finalizers))) && (!has(oldObject.metadata.finalizers) ||
    oldObject.metadata.finalizers.all(f, f.startsWith('compilecache.io/') || (has(object.metadata.finalizers) &&
    f in object.metadata.finalizers))))
  message: "the compilecache operator may add or remove only compilecache.io/ finalizers of {{ $what }}"
{{- end }}
{{- end }}
