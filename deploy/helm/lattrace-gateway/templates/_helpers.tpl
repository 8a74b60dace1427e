{{- define "gateway.labels" -}}
app.kubernetes.io/name: lattrace-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gateway.selector" -}}
app.kubernetes.io/name: lattrace-gateway
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .tier }}
{{- end }}

{{- define "gateway.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- /* The parts of a Collector config both tiers share: OTLP in, the
health endpoint, a memory limit below the container's, and no telemetry
port of the Collector's own. */ -}}
{{- define "gateway.receivers" -}}
extensions:
  health_check:
    endpoint: 0.0.0.0:{{ .Values.ports.health }}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 0.0.0.0:{{ .Values.ports.otlpGrpc }}
      http:
        endpoint: 0.0.0.0:{{ .Values.ports.otlpHttp }}
{{- end }}

{{- define "gateway.memoryLimiter" -}}
memory_limiter:
  check_interval: 1s
  limit_percentage: 80
  spike_limit_percentage: 20
{{- end }}

{{- define "gateway.telemetry" -}}
metrics:
  level: normal
  readers:
    - pull:
        exporter:
          prometheus:
            host: 0.0.0.0
            port: {{ .Values.ports.metrics }}
{{- end }}
