{{/* Names, labels and URLs shared by every template. */}}

{{- define "taugrid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every object name, cluster-scoped ones included, so two releases with different
names never collide. Kept to 45 characters so "<fullname>-controller-auth-delegator" fits 63.
*/}}
{{- define "taugrid.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "taugrid.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "taugrid.labels" -}}
helm.sh/chart: {{ include "taugrid.chart" . }}
app.kubernetes.io/name: {{ include "taugrid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: taugrid
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "controller"). */}}
{{- define "taugrid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "taugrid.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "taugrid.componentLabels" -}}
{{ include "taugrid.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "taugrid.controller.fullname" -}}
{{- printf "%s-controller" (include "taugrid.fullname" .) -}}
{{- end -}}

{{- define "taugrid.agent.fullname" -}}
{{- printf "%s-agent" (include "taugrid.fullname" .) -}}
{{- end -}}

{{- define "taugrid.controller.serviceAccountName" -}}
{{- default (include "taugrid.controller.fullname" .) .Values.controller.serviceAccount.name -}}
{{- end -}}

{{- define "taugrid.agent.serviceAccountName" -}}
{{- default (include "taugrid.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{- define "taugrid.leaseName" -}}
{{- default (include "taugrid.controller.fullname" .) .Values.controller.leaseName -}}
{{- end -}}

{{- define "taugrid.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "taugrid.controller.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{/* The controller Service's in-cluster DNS name. */}}
{{- define "taugrid.controller.host" -}}
{{- printf "%s.%s.svc.%s" (include "taugrid.controller.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* URL of the controller Service, the default for heartbeats and run pods. */}}
{{- define "taugrid.controller.serviceUrl" -}}
{{- printf "%s://%s:%v" (ternary "https" "http" .Values.tls.enabled) (include "taugrid.controller.host" .) .Values.controller.service.port -}}
{{- end -}}

{{/*
The headless Service over the controller pods. DNS names each of its endpoints
`<pod IP, dashed>.<this Service's domain>`; the replicas advertise themselves by that name
(TAUGRID_CONTROLLER_ADVERTISE_DOMAIN), which the certificate's wildcard covers.
*/}}
{{- define "taugrid.controller.podsServiceName" -}}
{{- printf "%s-pods" (include "taugrid.controller.fullname" .) -}}
{{- end -}}

{{/*
The leader-only Service: its selector adds the label the leader keeps on its own pod
(taugrid.dev/leader=true), so followers reach the leader through it and never through an
address read off the cluster.
*/}}
{{- define "taugrid.controller.leaderServiceName" -}}
{{- printf "%s-leader" (include "taugrid.controller.fullname" .) -}}
{{- end -}}

{{- define "taugrid.controller.leaderHost" -}}
{{- printf "%s.%s.svc.%s" (include "taugrid.controller.leaderServiceName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "taugrid.controller.leaderUrl" -}}
{{- printf "%s://%s:%v" (ternary "https" "http" .Values.tls.enabled) (include "taugrid.controller.leaderHost" .) .Values.controller.port -}}
{{- end -}}

{{- define "taugrid.controller.podsDomain" -}}
{{- printf "%s.%s.svc.%s" (include "taugrid.controller.podsServiceName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* Secret and key of the CA that issued the controller's certificate, as the agents mount it. */}}
{{- define "taugrid.controllerCA.secretName" -}}
{{- default (include "taugrid.tlsSecretName" .) .Values.agent.controllerCA.secretName -}}
{{- end -}}

{{- define "taugrid.controllerCA.key" -}}
{{- default .Values.tls.caKey .Values.agent.controllerCA.key -}}
{{- end -}}

{{/* image reference: call with (dict "ctx" $ "image" .Values.controller.image). */}}
{{- define "taugrid.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/*
"true" when the prerequisites are checked: always, or (auto) when Helm talks to a cluster.
Offline rendering (lint, template) cannot see the cluster's APIs, and `lookup` answers nothing
there, so a lookup of kube-system tells the two apart.
*/}}
{{- define "taugrid.checkPrerequisites" -}}
{{- $mode := toString .Values.prerequisites.check -}}
{{- if eq $mode "always" -}}
true
{{- else if eq $mode "auto" -}}
{{- if lookup "v1" "Namespace" "" "kube-system" -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Environment variables from a settings map: call with (dict "prefix" "TAUGRID_AGENT_" "settings"
map). Keys are snake_case setting names; maps and lists are JSON, as pydantic-settings reads them.
*/}}
{{- define "taugrid.settingsEnv" -}}
{{- $prefix := .prefix -}}
{{- range $key, $value := .settings }}
- name: {{ printf "%s%s" $prefix (upper $key) }}
  value: {{ if or (kindIs "map" $value) (kindIs "slice" $value) }}{{ toJson $value | quote }}{{ else }}{{ toString $value | quote }}{{ end }}
{{- end }}
{{- end -}}

{{- /*
controller.managedNodeSelector as a CEL expression over `variables.nodeLabels` (the
admission policy's "a node this release manages"): each term of the Kubernetes label
selector grammar (k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)) becomes one clause,
all joined by &&; an empty selector is `true` (every node, as TAUGRID_CONTROLLER_NODE_SELECTOR
means). A term the grammar does not know fails the install rather than widening the policy.
*/ -}}
{{- define "taugrid.managedNodeCel" -}}
{{- $clauses := list -}}
{{- range (regexFindAll "[^,(]+(\\([^)]*\\))?" (default "" .Values.controller.managedNodeSelector) -1) -}}
{{- $t := trim . -}}
{{- if $t -}}
{{- if regexMatch "^\\S+\\s+notin\\s*\\(.*\\)$" $t -}}
{{- $k := regexReplaceAll "^(\\S+)\\s+notin\\s*\\((.*)\\)$" $t "${1}" -}}
{{- $vs := list -}}{{- range splitList "," (regexReplaceAll "^(\\S+)\\s+notin\\s*\\((.*)\\)$" $t "${2}") -}}{{- $vs = append $vs (trim .) -}}{{- end -}}
{{- $clauses = append $clauses (printf "(!(%s in variables.nodeLabels) || !(variables.nodeLabels[%s] in %s))" (toJson $k) (toJson $k) (toJson $vs)) -}}
{{- else if regexMatch "^\\S+\\s+in\\s*\\(.*\\)$" $t -}}
{{- $k := regexReplaceAll "^(\\S+)\\s+in\\s*\\((.*)\\)$" $t "${1}" -}}
{{- $vs := list -}}{{- range splitList "," (regexReplaceAll "^(\\S+)\\s+in\\s*\\((.*)\\)$" $t "${2}") -}}{{- $vs = append $vs (trim .) -}}{{- end -}}
{{- $clauses = append $clauses (printf "(%s in variables.nodeLabels && variables.nodeLabels[%s] in %s)" (toJson $k) (toJson $k) (toJson $vs)) -}}
{{- else if regexMatch "^[^=!\\s]+\\s*!=\\s*[^=!\\s]*$" $t -}}
{{- $k := trim (regexReplaceAll "^([^=!\\s]+)\\s*!=\\s*([^=!\\s]*)$" $t "${1}") -}}
{{- $v := trim (regexReplaceAll "^([^=!\\s]+)\\s*!=\\s*([^=!\\s]*)$" $t "${2}") -}}
{{- $clauses = append $clauses (printf "(!(%s in variables.nodeLabels) || variables.nodeLabels[%s] != %s)" (toJson $k) (toJson $k) (toJson $v)) -}}
{{- else if regexMatch "^[^=!\\s]+\\s*==?\\s*[^=!\\s]*$" $t -}}
{{- $k := trim (regexReplaceAll "^([^=!\\s]+)\\s*==?\\s*([^=!\\s]*)$" $t "${1}") -}}
{{- $v := trim (regexReplaceAll "^([^=!\\s]+)\\s*==?\\s*([^=!\\s]*)$" $t "${2}") -}}
{{- $clauses = append $clauses (printf "(%s in variables.nodeLabels && variables.nodeLabels[%s] == %s)" (toJson $k) (toJson $k) (toJson $v)) -}}
{{- else if regexMatch "^![^=!\\s]+$" $t -}}
{{- $clauses = append $clauses (printf "!(%s in variables.nodeLabels)" (toJson (trimPrefix "!" $t))) -}}
{{- else if regexMatch "^[^=!\\s]+$" $t -}}
{{- $clauses = append $clauses (printf "(%s in variables.nodeLabels)" (toJson $t)) -}}
{{- else -}}
{{- fail (printf "controller.managedNodeSelector: %q is not a label selector term" $t) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $clauses -}}{{ join " && " $clauses }}{{- else -}}true{{- end -}}
{{- end -}}

{{/*
With kueue.enabled, Kueue's CRDs and webhooks come with this very release (the kueue subchart
renders its CRDs as templates), so on install the Kueue objects the chart makes (AdmissionCheck,
WorkloadPriorityClass, queues) cannot be created with the rest: Helm would find no such kind,
and Kueue's webhooks would not answer yet. They are post-install hooks then (`helm install
--wait` runs them once Kueue is ready), carrying the release's ownership marks so that the
first `helm upgrade` takes them over as ordinary objects of the release. Call with
(dict "ctx" $ "weight" N); renders `annotations:` or nothing.
*/}}
{{- define "taugrid.kueueHook" -}}
{{- $ctx := .ctx -}}
{{- if and $ctx.Values.kueue.enabled $ctx.Release.IsInstall -}}
annotations:
  helm.sh/hook: post-install
  helm.sh/hook-weight: {{ .weight | quote }}
  meta.helm.sh/release-name: {{ $ctx.Release.Name }}
  meta.helm.sh/release-namespace: {{ $ctx.Release.Namespace }}
{{- end -}}
{{- end -}}
