{{/* Bundle signatures and confinement (docs/security.md): the operator's flags, the signing key's mount. */}}

{{/* The Secret holding the signing key. */}}
{{- define "compilecache-operator.signingSecretName" -}}
{{- .Values.signing.existingSecret | default (printf "%s-signing" (include "compilecache-operator.fullname" .)) -}}
{{- end }}

{{/* The destination (host:port, s3://bucket, file:///root) of storage.url, as the operator computes it. */}}
{{- define "compilecache-operator.defaultStoreHost" -}}
{{- with .Values.storage.url }}
{{- $u := urlParse . }}
{{- if has $u.scheme (list "redis" "rediss") }}
{{- $hostport := regexReplaceAll "^.*@" $u.host "" }}
{{- if contains ":" $hostport }}{{ lower $hostport }}{{ else }}{{ lower $hostport }}:6379{{ end }}
{{- else if eq $u.scheme "s3" }}
{{- if contains "endpoint=" $u.query }}
{{- $e := regexReplaceAll "^(.*&)?endpoint=([^&]*).*$" $u.query "${2}" | urlParse }}
{{- if contains ":" $e.host }}{{ lower $e.host }}{{ else }}{{ lower $e.host }}:{{ ternary "443" "80" (eq $e.scheme "https") }}{{ end }}
{{- else }}s3://{{ $u.host }}{{ end }}
{{- else }}{{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The allow-lists, each with the chart's own store / Secret in it; JSON arrays. */}}
{{- define "compilecache-operator.allowedStoreHosts" -}}
{{- $list := .Values.confinement.storeHosts | default list }}
{{- with include "compilecache-operator.defaultStoreHost" . }}{{ $list = append $list . }}{{ end }}
{{- $list | uniq | toJson }}
{{- end }}
{{- define "compilecache-operator.allowedStoreSecrets" -}}
{{- $list := .Values.confinement.storeSecrets | default list }}
{{- with .Values.storage.credentialsSecret }}{{ $list = append $list . }}{{ end }}
{{- $list | uniq | toJson }}
{{- end }}

{{- define "compilecache-operator.securityArgs" -}}
{{- if .Values.confinement.enabled }}
- --allowed-store-hosts={{ include "compilecache-operator.allowedStoreHosts" . | fromJsonArray | join "," }}
- --allowed-store-secrets={{ include "compilecache-operator.allowedStoreSecrets" . | fromJsonArray | join "," }}
- --allowed-warmup-service-accounts={{ .Values.confinement.warmupServiceAccounts | default list | join "," }}
- --allowed-warmup-secrets={{ .Values.confinement.warmupSecrets | default list | join "," }}
- --allowed-warmup-pull-secrets={{ .Values.confinement.warmupPullSecrets | default list | join "," }}
- --allowed-warmup-service-account-tokens={{ .Values.confinement.warmupServiceAccountTokens | default list | join "," }}
{{- end }}
{{- if and .Values.signing.enabled .Values.signing.existingSecret }}
- --signing-key-file=/etc/compilecache/signing/signing.key
{{- else if .Values.signing.enabled }}
{{- /* The operator creates the key into this Secret once, at run time, and never replaces it (docs/security.md). */}}
- --signing-key-secret={{ include "compilecache-operator.signingSecretName" . }}
{{- end }}
{{- if .Values.signing.enabled }}
{{- with .Values.signing.additionalTrustedKeys }}
- --trusted-public-keys={{ join "," . }}
{{- end }}
{{- end }}
{{- end }}

{{- define "compilecache-operator.securityVolumeMounts" -}}
{{- if and .Values.signing.enabled .Values.signing.existingSecret }}
- name: signing-key
  mountPath: /etc/compilecache/signing
  readOnly: true
{{- end }}
{{- end }}

{{- define "compilecache-operator.securityVolumes" -}}
{{- if and .Values.signing.enabled .Values.signing.existingSecret }}
- name: signing-key
  secret:
    secretName: {{ include "compilecache-operator.signingSecretName" . }}
    defaultMode: 0400
    items:
      - key: signing.key
        path: signing.key
{{- end }}
{{- end }}
