{{/* Names and labels shared by every object of the release. */}}

{{- define "ratelimitd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ratelimitd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "ratelimitd.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ratelimitd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ratelimitd.name" . }}
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

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "ratelimitd.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "ratelimitd.image" -}}
{{- include "ratelimitd.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{- define "ratelimitd.sidecarsImage" -}}
{{- include "ratelimitd.imageRef" (dict "image" .Values.sidecars.image "appVersion" .Chart.AppVersion) -}}
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
{{- if and (include "ratelimitd.autoscaling" .) (not (kindIs "invalid" $n)) -}}
{{- fail (printf "replicaCount=%v with the autoscaler on: the HorizontalPodAutoscaler owns the replica count; set autoscaling.minReplicas, or autoscaling.enabled=false" $n) -}}
{{- end -}}
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

{{/* The `helm test` pod's labels (the NetworkPolicy admits it to gRPC). */}}
{{- define "ratelimitd.testLabels" -}}
app.kubernetes.io/name: {{ include "ratelimitd.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end -}}
