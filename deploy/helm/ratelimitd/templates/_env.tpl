{{/* The daemon's environment: the Go service's variable names, as Envoy Gateway sets them. */}}
{{- define "ratelimitd.env" -}}
{{- $v := .Values -}}
- name: LOG_LEVEL
  value: {{ $v.logLevel | quote }}
- name: USE_STATSD
  value: "false"
{{- if not $v.debug.exposed }}
{{- /* The debug listener needs no credentials: the pod's loopback only, for port-forward. */}}
- name: DEBUG_HOST
  value: 127.0.0.1
{{- end }}
{{- if $v.metrics.enabled }}
- name: USE_PROMETHEUS
  value: "true"
- name: PROMETHEUS_ADDR
  value: {{ printf ":%v" $v.metrics.port | quote }}
{{- end }}
{{- if eq $v.config.source "configmap" }}
{{- /* The ConfigMap is mounted at /data/ratelimit/config, as Envoy Gateway lays it out;
       the kubelet's ..data link and timestamped directory are not rule files. */}}
- name: RUNTIME_ROOT
  value: /data
- name: RUNTIME_SUBDIRECTORY
  value: ratelimit
- name: RUNTIME_WATCH_ROOT
  value: "false"
- name: RUNTIME_IGNOREDOTFILES
  value: "true"
{{- else }}
- name: CONFIG_TYPE
  value: GRPC_XDS_SOTW
- name: CONFIG_GRPC_XDS_SERVER_URL
  value: {{ $v.xds.serverURL | quote }}
- name: CONFIG_GRPC_XDS_NODE_ID
  value: {{ $v.xds.nodeId | quote }}
- name: FORCE_START_WITHOUT_INITIAL_CONFIG
  value: {{ $v.xds.forceStartWithoutInitialConfig | quote }}
{{- if $v.tls.enabled }}
- name: CONFIG_GRPC_XDS_SERVER_USE_TLS
  value: "true"
- name: CONFIG_GRPC_XDS_CLIENT_TLS_CERT
  value: /certs/tls.crt
- name: CONFIG_GRPC_XDS_CLIENT_TLS_KEY
  value: /certs/tls.key
- name: CONFIG_GRPC_XDS_SERVER_TLS_CACERT
  value: /certs/ca.crt
{{- end }}
{{- end }}
{{- if $v.tls.enabled }}
- name: GRPC_SERVER_USE_TLS
  value: "true"
- name: GRPC_SERVER_TLS_CERT
  value: /certs/tls.crt
- name: GRPC_SERVER_TLS_KEY
  value: /certs/tls.key
{{- if $v.tls.requireClientCertificate }}
- name: GRPC_CLIENT_TLS_CACERT
  value: /certs/ca.crt
{{- end }}
{{- end }}
{{- if include "ratelimitd.memory" . }}
- name: BACKEND_TYPE
  value: memory
{{- else }}
{{- $r := $v.backend.redis }}
{{- $type := $v.backend.type | replace "redis" "single" }}
- name: BACKEND_TYPE
  value: redis
- name: REDIS_SOCKET_TYPE
  value: tcp
- name: REDIS_TYPE
  value: {{ $type }}
{{- if $r.urlSecret.name }}
{{ include "ratelimitd.secretEnv" (dict "name" "REDIS_URL" "ref" $r.urlSecret "what" "backend.redis.urlSecret") }}
{{- else }}
- name: REDIS_URL
  value: {{ required "backend.redis.url: the Redis address" $r.url | quote }}
{{- end }}
- name: REDIS_POOL_SIZE
  value: {{ $r.poolSize | quote }}
{{- if $r.authSecret.name }}
{{ include "ratelimitd.secretEnv" (dict "name" "REDIS_AUTH" "ref" $r.authSecret "what" "backend.redis.authSecret") }}
{{- end }}
{{- if $r.sentinelAuthSecret.name }}
{{ include "ratelimitd.secretEnv" (dict "name" "REDIS_SENTINEL_AUTH" "ref" $r.sentinelAuthSecret "what" "backend.redis.sentinelAuthSecret") }}
{{- end }}
{{- if $r.tls.enabled }}
- name: REDIS_TLS
  value: "true"
{{- if $r.tls.secretName }}
- name: REDIS_TLS_CLIENT_CERT
  value: /redis-certs/tls.crt
- name: REDIS_TLS_CLIENT_KEY
  value: /redis-certs/tls.key
{{- if $r.tls.useCA }}
- name: REDIS_TLS_CACERT
  value: /redis-certs/ca.crt
{{- end }}
{{- end }}
{{- if $r.tls.skipHostnameVerification }}
- name: REDIS_TLS_SKIP_HOSTNAME_VERIFICATION
  value: "true"
{{- end }}
{{- end }}
{{- if $r.breakerFailures }}
- name: BACKEND_BREAKER_FAILURES
  value: {{ $r.breakerFailures | quote }}
{{- end }}
{{- if $r.perSecond.enabled }}
- name: REDIS_PERSECOND
  value: "true"
- name: REDIS_PERSECOND_SOCKET_TYPE
  value: tcp
- name: REDIS_PERSECOND_TYPE
  value: {{ $type }}
- name: REDIS_PERSECOND_URL
  value: {{ required "backend.redis.perSecond.url: the per-second Redis address" $r.perSecond.url | quote }}
- name: REDIS_PERSECOND_POOL_SIZE
  value: {{ $r.poolSize | quote }}
{{- if $r.authSecret.name }}
{{ include "ratelimitd.secretEnv" (dict "name" "REDIS_PERSECOND_AUTH" "ref" $r.authSecret "what" "backend.redis.authSecret") }}
{{- end }}
{{- if $r.sentinelAuthSecret.name }}
{{ include "ratelimitd.secretEnv" (dict "name" "REDIS_PERSECOND_SENTINEL_AUTH" "ref" $r.sentinelAuthSecret "what" "backend.redis.sentinelAuthSecret") }}
{{- end }}
{{- if $r.tls.enabled }}
- name: REDIS_PERSECOND_TLS
  value: "true"
{{- end }}
{{- end }}
{{- end }}
{{- if $v.tracing.enabled }}
- name: TRACING_ENABLED
  value: "true"
- name: TRACING_EXPORTER_PROTOCOL
  value: {{ $v.tracing.protocol | quote }}
- name: TRACING_SERVICE_NAME
  value: {{ $v.tracing.serviceName | quote }}
- name: TRACING_SERVICE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: TRACING_SERVICE_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: TRACING_SAMPLING_RATE
  value: {{ $v.tracing.samplingRate | quote }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $v.tracing.endpoint | quote }}
{{- end }}
{{- include "ratelimitd.envList" $v.extraEnv }}
{{- end -}}
