{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sluice.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sluice.secretName" -}}
{{- default (include "sluice.fullname" .) .Values.password.existingSecret -}}
{{- end -}}

{{- define "sluice.clusterSecretName" -}}
{{- default (printf "%s-cluster" (include "sluice.fullname" .)) .Values.cluster.existingSecret -}}
{{- end -}}

{{/* The preStop pause: the drain of cluster mode, or the plain one. */}}
{{- define "sluice.preStopSeconds" -}}
{{- if .Values.cluster.enabled -}}
{{- max .Values.preStopSleepSeconds .Values.cluster.drainSeconds -}}
{{- else -}}
{{- .Values.preStopSleepSeconds -}}
{{- end -}}
{{- end -}}
