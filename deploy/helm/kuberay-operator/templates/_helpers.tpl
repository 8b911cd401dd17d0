{{- define "kuberay-operator.fullname" -}}
{{- .Values.fullnameOverride | default "kuberay-operator" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kuberay-operator.labels" -}}
app.kubernetes.io/name: kuberay
app.kubernetes.io/component: kuberay-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kuberay-operator.selector" -}}
app.kubernetes.io/name: kuberay
app.kubernetes.io/component: kuberay-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The rules of one released RBAC manifest (files/rbac/<name>), which must be there. */}}
{{- define "kuberay-operator.rules" -}}
{{- $path := printf "files/rbac/%s" .name -}}
{{- $text := .ctx.Files.Get $path -}}
{{- if not $text -}}
{{- fail (printf "%s is missing: the chart is assembled by `taugrid dev build` from the ray-operator module" $path) -}}
{{- end -}}
{{- toYaml (get (fromYaml (trimPrefix "---\n" $text)) "rules") -}}
{{- end -}}
