{{/* Helpers of the operator's templates (operator-*.yaml). */}}

{{- define "chimera.operator.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chimera.webhook.service" -}}
{{- printf "%s-webhook" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chimera.webhook.configName" -}}
{{- printf "%s-validating-webhook" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chimera.webhook.mutatingConfigName" -}}
{{- printf "%s-fuse-sidecar-injector" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The chimera-fuse sidecar's image: the dataplane image, which carries
chimera-fuse next to chimerad. */ -}}
{{- define "chimera.fuseSidecar.image" -}}
{{- printf "%s:%s" .Values.fuseSidecar.image.repository (default .Chart.AppVersion .Values.fuseSidecar.image.tag) -}}
{{- end -}}

{{- define "chimera.fuseSidecar.enabled" -}}
{{- if and .Values.operator.enabled .Values.webhook.enabled .Values.fuseSidecar.enabled }}true{{ end -}}
{{- end -}}

{{- define "chimera.webhook.certSecret" -}}
{{- printf "%s-webhook-cert" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chimera.operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "chimera.operator.selectorLabels" -}}
app.kubernetes.io/name: chimera-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "chimera.operator.labels" -}}
{{ include "chimera.operator.selectorLabels" . }}
app.kubernetes.io/part-of: chimera
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* The NetworkPolicy peer of the metrics scrapers (networkPolicy.metrics),
as JSON; both selectors null: every pod of the policy's namespace. */ -}}
{{- define "chimera.metricsPeer" -}}
{{- $m := .Values.networkPolicy.metrics -}}
{{- $peer := dict -}}
{{- if not (kindIs "invalid" $m.namespaceSelector) }}{{ $_ := set $peer "namespaceSelector" $m.namespaceSelector }}{{ end -}}
{{- if not (kindIs "invalid" $m.podSelector) }}{{ $_ := set $peer "podSelector" $m.podSelector }}{{ end -}}
{{- if not $peer }}{{ $_ := set $peer "podSelector" (dict) }}{{ end -}}
{{- toJson $peer -}}
{{- end -}}

{{- /* Labels of the monitoring objects (templates/monitoring-*.yaml). */ -}}
{{- define "chimera.monitoring.labels" -}}
app.kubernetes.io/name: chimera-monitoring
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: chimera
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
