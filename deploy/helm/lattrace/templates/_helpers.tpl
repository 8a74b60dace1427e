{{- define "lattrace.labels" -}}
app.kubernetes.io/name: lattrace
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "lattrace.selector" -}}
app.kubernetes.io/name: lattrace
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
