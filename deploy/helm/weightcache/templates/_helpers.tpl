{{/* Names and labels. */}}
{{- define "weightcache.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weightcache.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "weightcache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weightcache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "weightcache.labels" -}}
{{ include "weightcache.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "weightcache.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* A model's /health and /metrics port: healthPort, else 9400 + index. */}}
{{- define "weightcache.healthPort" -}}
{{- if .model.healthPort -}}{{ .model.healthPort }}{{- else -}}{{ add 9400 .index }}{{- end -}}
{{- end -}}

{{/* Where a model's sockets are on the node. */}}
{{- define "weightcache.socketHostPath" -}}
{{ trimSuffix "/" .root.Values.socketDir.hostPath }}/{{ .model.name }}
{{- end -}}
