{{/* Names and labels shared by every object of the release. */}}

{{- define "ratelimitd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ratelimitd.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ratelimitd.labels" -}}
{{ include "ratelimitd.selectorLabels" . }}
{{- /* Envoy Gateway's rate-limit pods carry this; its "Global Ratelimit" dashboard selects on it. */}}
app.kubernetes.io/component: ratelimit
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ratelimitd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ratelimitd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ratelimitd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ratelimitd.sidecarsImage" -}}
{{- $image := .Values.sidecars.image -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* The daemon's container and pod security settings (Envoy Gateway's, plus a read-only root). */}}
{{- define "ratelimitd.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
fsGroup: 65534
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ratelimitd.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The gRPC address of this release's daemon, for the sidecars. */}}
{{- define "ratelimitd.grpcAddress" -}}
{{- printf "%s.%s.svc:8081" (include "ratelimitd.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* An env entry whose value comes from a Secret given as {name, key}. */}}
{{- define "ratelimitd.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "%s: the Secret's name" .what) .ref.name }}
      key: {{ required (printf "%s: the Secret's key" .what) .ref.key }}
{{- end -}}

{{/* Whether counters live in the process: one replica, no autoscaler, no budget. */}}
{{- define "ratelimitd.memory" -}}
{{- if eq .Values.backend.type "memory" -}}true{{- end -}}
{{- end -}}

{{/* autoscaling.enabled, podDisruptionBudget.enabled and replicaCount, resolved per backend.
     The memory backend refuses what would start a second counting process. */}}
{{- define "ratelimitd.autoscaling" -}}
{{- $on := .Values.autoscaling.enabled -}}
{{- if include "ratelimitd.memory" . -}}
{{- if $on -}}
{{- fail "autoscaling.enabled=true: the memory backend counts per process (each replica would see part of the traffic); use backend.type=redis to scale out" -}}
{{- end -}}
{{- else if or $on (kindIs "invalid" $on) -}}true
{{- end -}}
{{- end -}}

{{- define "ratelimitd.pdb" -}}
{{- $on := .Values.podDisruptionBudget.enabled -}}
{{- if and (not (include "ratelimitd.memory" .)) (or $on (kindIs "invalid" $on)) -}}true{{- end -}}
{{- end -}}

{{- define "ratelimitd.replicas" -}}
{{- $n := .Values.replicaCount -}}
{{- if include "ratelimitd.memory" . -}}
{{- if and (not (kindIs "invalid" $n)) (ne (int $n) 1) -}}
{{- fail (printf "replicaCount=%v: the memory backend counts per process (each replica would see part of the traffic); use 1, or backend.type=redis to scale out" $n) -}}
{{- end -}}
1
{{- else -}}
{{- kindIs "invalid" $n | ternary 2 $n -}}
{{- end -}}
{{- end -}}

{{/* A list of env entries from values; a plain value is written as a string whatever its
     YAML type (`--set env[0].value=true` would otherwise render a boolean the API refuses). */}}
{{- define "ratelimitd.envList" -}}
{{- range . }}
- name: {{ .name }}
{{- if hasKey . "valueFrom" }}
  valueFrom:
    {{- toYaml .valueFrom | nindent 4 }}
{{- else }}
  value: {{ .value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}
