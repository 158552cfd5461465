{{/* Chart name, overridable. */}}
{{- define "compilecache-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. At most 47 characters:
room for the longest suffix the chart appends ("-webhook-serving", 16), so that every object's name stays distinct and
a Service's name within a DNS label (63). */}}
{{- define "compilecache-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart label value. */}}
{{- define "compilecache-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels (stable across upgrades). */}}
{{- define "compilecache-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "compilecache-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "compilecache-operator.labels" -}}
helm.sh/chart: {{ include "compilecache-operator.chart" . }}
{{ include "compilecache-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: compilecache
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* ServiceAccount name. */}}
{{- define "compilecache-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "compilecache-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference from {repository, tag, digest}: the digest wins, the tag defaults to appVersion. */}}
{{- define "compilecache-operator.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- if not (regexMatch "^sha256:[a-f0-9]{64}$" $image.digest) }}
{{- fail (printf "image digest %q must look like sha256:<64 hex>" $image.digest) }}
{{- end }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* Names of the Services and the webhook certificate Secret. */}}
{{- define "compilecache-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "compilecache-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "compilecache-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "compilecache-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "compilecache-operator.webhookCertSecretName" -}}
{{- if .Values.webhook.providedCert.secretName }}
{{- .Values.webhook.providedCert.secretName }}
{{- else }}
{{- printf "%s-webhook-tls" (include "compilecache-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{/* Whether the operator makes and rotates the webhook's serving certificate itself (neither cert-manager nor a
provided certificate), and the Secret it keeps it in. */}}
{{- define "compilecache-operator.operatorServingCert" -}}
{{- and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) (not .Values.webhook.providedCert.secretName) -}}
{{- end }}
{{/* Whether CompileCaches are checked at admission (confinement.admissionPolicy): the operator's validating webhook,
served by the same server as the pod webhook. */}}
{{- define "compilecache-operator.checkCachesAtAdmission" -}}
{{- and .Values.webhook.enabled .Values.confinement.enabled .Values.confinement.admissionPolicy.enabled -}}
{{- end }}
{{- define "compilecache-operator.webhookServingSecretName" -}}
{{- printf "%s-webhook-serving" (include "compilecache-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "compilecache-operator.webhookCertificateName" -}}
{{- printf "%s-webhook" (include "compilecache-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* DNS names the webhook certificate must carry. */}}
{{- define "compilecache-operator.webhookDNSNames" -}}
{{- $svc := include "compilecache-operator.webhookServiceName" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/* Namespaces holding storage Secrets the operator may read. */}}
{{- define "compilecache-operator.secretNamespaces" -}}
{{- $list := .Values.rbac.secretNamespaces | default (list .Release.Namespace) }}
{{- $list | uniq | toJson }}
{{- end }}

{{/* Whether the operator watches every namespace. */}}
{{- define "compilecache-operator.clusterWide" -}}
{{- if .Values.operator.watchNamespaces }}false{{ else }}true{{ end }}
{{- end }}

{{/* Store credentials from storage.credentialsSecret, with the Secret keys the operator uses for CompileCaches:
     "password" for Redis, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN for S3 (all optional, so one
     Secret shape serves either store). */}}
{{- define "compilecache-operator.storageCredentialEnv" -}}
{{- with .Values.storage.credentialsSecret }}
{{- $secret := . }}
{{- range $env, $key := dict "COMPILECACHE_REDIS_PASSWORD" "password" "AWS_ACCESS_KEY_ID" "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" "AWS_SECRET_ACCESS_KEY" "AWS_SESSION_TOKEN" "AWS_SESSION_TOKEN" }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret | quote }}
      key: {{ $key | quote }}
      optional: true
{{- end }}
{{- end }}
{{- end }}

{{/* "true" where the cluster serves prometheus-operator's kind (list . "ServiceMonitor"): helm install asks the API
server, which names every kind it serves; helm template takes --api-versions, the kinds
("monitoring.coreos.com/v1/ServiceMonitor") or the group/version alone ("monitoring.coreos.com/v1", as Argo CD may
pass it), which then stands for all three. Where any kind of the group is named, only the kinds named count (a
cluster may serve ServiceMonitor and PodMonitor without PrometheusRule). */}}
{{- define "compilecache-operator.servesMonitoring" -}}
{{- $caps := (index . 0).Capabilities.APIVersions }}
{{- $gv := "monitoring.coreos.com/v1" }}
{{- $kinds := list "ServiceMonitor" "PodMonitor" "PrometheusRule" }}
{{- $named := false }}
{{- range $kinds }}{{ if $caps.Has (printf "%s/%s" $gv .) }}{{ $named = true }}{{ end }}{{ end }}
{{- or ($caps.Has (printf "%s/%s" $gv (index . 1))) (and (not $named) ($caps.Has $gv)) -}}
{{- end }}
