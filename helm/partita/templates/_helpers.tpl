{{/* The release's base name: "partita" for a release named partita. */}}
{{- define "partita.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default "partita" .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "partita.labels" -}}
app.kubernetes.io/name: partita
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "webhook"). */}}
{{- define "partita.selectorLabels" -}}
app.kubernetes.io/name: partita
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "partita.componentLabels" -}}
{{ include "partita.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "partita.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* kube-scheduler's image: the cluster's own version unless a tag is given. */}}
{{- define "partita.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{ .Values.scheduler.image.repository }}:{{ $tag }}
{{- end -}}

{{- define "partita.webhookName" -}}{{ include "partita.fullname" . }}-webhook{{- end -}}
{{- define "partita.extenderName" -}}{{ include "partita.fullname" . }}-extender{{- end -}}
{{- define "partita.agentName" -}}{{ include "partita.fullname" . }}-agent{{- end -}}
{{- define "partita.mpsKeeperName" -}}{{ include "partita.fullname" . }}-mps-keeper{{- end -}}
{{- define "partita.interposerName" -}}{{ include "partita.fullname" . }}-interposer{{- end -}}
{{- define "partita.modelCacheName" -}}{{ include "partita.fullname" . }}-model-cache{{- end -}}
{{/*
"true" where the chart installs HAMi-core for hami-core slices
(agent.interposer): as agent.interposer.enabled says, and where that is null
on every node that may run hami-core (agent.isolation hami-core, or empty
so that each GPUNode's spec.isolation decides) unless the agent simulates
its GPUs. Empty otherwise.
*/}}
{{- define "partita.interposerEnabled" -}}
{{- $a := .Values.agent -}}
{{- $e := $a.interposer.enabled -}}
{{- if not $a.enabled -}}
{{- else if kindIs "bool" $e -}}{{ if $e }}true{{ end }}
{{- else if and (has $a.isolation (list "" "hami-core")) (not $a.simulate) -}}true
{{- end -}}
{{- end -}}
{{- define "partita.schedulerName" -}}{{ include "partita.fullname" . }}-scheduler{{- end -}}
{{- define "partita.consoleName" -}}{{ include "partita.fullname" . }}-console{{- end -}}
{{- define "partita.certSecret" -}}{{ include "partita.fullname" . }}-webhook-cert{{- end -}}
{{/* kube-scheduler's client certificate for the extender, with its own CA. */}}
{{- define "partita.schedulerClientSecret" -}}{{ include "partita.fullname" . }}-scheduler-client-cert{{- end -}}
{{/* The client certificate's common name, which the extender accepts. */}}
{{- define "partita.schedulerClientName" -}}{{ include "partita.schedulerName" . }}{{- end -}}

{{/* The extender's in-cluster URL, as kube-scheduler calls it. */}}
{{- define "partita.extenderURL" -}}
https://{{ include "partita.extenderName" . }}.{{ .Release.Namespace }}.svc:443
{{- end -}}

{{/* Where the extender's CA lies inside the scheduler container. */}}
{{- define "partita.schedulerCADir" -}}/etc/partita/extender-ca{{- end -}}
{{/* Where its client certificate lies inside the scheduler container. */}}
{{- define "partita.schedulerClientDir" -}}/etc/partita/scheduler-client{{- end -}}

{{/*
The KubeSchedulerConfiguration that wires the extender in. It must equal
extender.SchedulerConfig for the same options (helm/chart_test.go checks it):
JSON-quoted strings, the same keys in the same order.
*/}}
{{- define "partita.schedulerConfig" -}}
{{- $s := .Values.scheduler -}}
{{- $url := include "partita.extenderURL" . -}}
{{- $ca := printf "%s/ca.crt" (include "partita.schedulerCADir" .) -}}
{{- $cert := printf "%s/tls.crt" (include "partita.schedulerClientDir" .) -}}
{{- $key := printf "%s/tls.key" (include "partita.schedulerClientDir" .) -}}
{{- $serverName := "" -}}
{{- if eq $s.mode "default" -}}
{{- $url = default $url $s.extenderURL -}}
{{- $ca = $s.extenderCAFile -}}
{{- $cert = $s.extenderClientCertFile -}}
{{- $key = $s.extenderClientKeyFile -}}
{{- if $s.extenderServerName -}}
{{- $serverName = $s.extenderServerName -}}
{{- else if $s.extenderURL -}}
{{- $serverName = printf "%s.%s.svc" (include "partita.extenderName" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}
# kube-scheduler configuration for Partita's extender; written by
# partita extender --print-scheduler-config. kube-scheduler calls the extender
# only for pods that request partita.dev/gpu-milli.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
# Every feasible node is looked at, not kube-scheduler's sample (46% of 500
# nodes): the admission loop holds a GPU pod's room on one node, which a
# sample misses about half the time (a failed attempt and a backoff).
percentageOfNodesToScore: 100
clientConnection:
  qps: {{ $s.qps }}
  burst: {{ $s.burst }}
{{- if eq $s.mode "second" }}
leaderElection:
  leaderElect: true
  resourceName: {{ include "partita.schedulerName" . | toJson }}
  resourceNamespace: {{ .Release.Namespace | toJson }}
profiles:
- schedulerName: {{ $s.name | toJson }}
  plugins:
    postFilter:
      disabled:
      - name: DefaultPreemption
{{- end }}
extenders:
- urlPrefix: {{ $url | toJson }}
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  preemptVerb: preempt
  weight: {{ $s.weight }}
  httpTimeout: {{ $s.httpTimeout | toJson }}
  enableHTTPS: true
  tlsConfig:
    caFile: {{ $ca | toJson }}
    certFile: {{ $cert | toJson }}
    keyFile: {{ $key | toJson }}
{{- with $serverName }}
    serverName: {{ . | toJson }}
{{- end }}
  nodeCacheCapable: true
  ignorable: false
  managedResources:
  - name: partita.dev/gpu-milli
    ignoredByScheduler: false
{{ end -}}

{{/* The pod webhooks' namespaceSelector: never kube-system nor the release's namespace. */}}
{{- define "partita.podNamespaceSelector" -}}
{{- with .Values.webhook.namespaceSelector.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
- key: kubernetes.io/metadata.name
  operator: NotIn
  values:
  - kube-system
  - {{ .Release.Namespace }}
  {{- range .Values.webhook.excludeNamespaces }}
  {{- if and (ne . "kube-system") (ne . $.Release.Namespace) }}
  - {{ . }}
  {{- end }}
  {{- end }}
{{- end -}}

{{/*
The admission objects' CEL that depends on values, as webhook.ConfigurationOptions
renders it (checked by helm/chart_test.go): who is trusted (the extender, as
--trusted-users says), the MPS directory, the admission gate. The rest comes
from files/admission-cel.yaml.
*/}}
{{- define "partita.celTrusted" -}}
(request.userInfo.?username.orValue('') in ['system:serviceaccount:{{ .Release.Namespace }}:{{ include "partita.extenderName" . }}'])
{{- end -}}

{{- define "partita.celParams" -}}
- name: mpsDir
  expression: {{ printf "'%s'" (clean (print "/" .Values.agent.mpsDir)) | quote }}
- name: admissionGate
  expression: {{ and .Values.webhook.admissionGate .Values.extender.admission.enabled | toString | quote }}
- name: trusted
  expression: {{ include "partita.celTrusted" . | quote }}
{{- end -}}

{{- define "partita.admissionCEL" -}}
{{- .Files.Get "files/admission-cel.yaml" -}}
{{- end -}}

{{/* Refuses clusters older than 1.30; a development build (v0.0.0) passes. */}}
{{- define "partita.checkKubeVersion" -}}
{{- $v := .Capabilities.KubeVersion.Version -}}
{{- if and (not (hasPrefix "v0.0.0" $v)) (semverCompare "<1.30.0-0" $v) -}}
{{- fail (printf "Partita needs Kubernetes 1.30 or newer (scheduling gates); this cluster runs %s" $v) -}}
{{- end -}}
{{- end -}}
