{{/* Names and labels. */}}
{{- define "fanout.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fanout.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fanout.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fanout.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fanout.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "fanout.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fanout
{{- end }}

{{- define "fanout.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fanout.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The fanout config: `config` from the values with the settings the chart owns laid over it —
the listeners (so probes, Service and ServiceMonitor hit the right ports) and the drain timings
(so they match the preStop hook and terminationGracePeriodSeconds).
*/}}
{{- define "fanout.config" -}}
{{- $owned := dict
  "listen" (printf "0.0.0.0:%d" (int .Values.ports.http))
  "admin" (dict "listen" (printf "0.0.0.0:%d" (int .Values.ports.admin)))
  "server" (dict
    "drain_delay" (printf "%ds" (int .Values.drainDelaySeconds))
    "shutdown_grace" (printf "%ds" (int .Values.shutdownGraceSeconds)))
}}
{{- $spread := int (default 0 .Values.streamDrainSpreadSeconds) }}
{{- if gt $spread 0 }}
{{- if ge $spread (int .Values.shutdownGraceSeconds) }}
{{- fail (printf "streamDrainSpreadSeconds (%d) must be shorter than shutdownGraceSeconds (%d): the last stream to end needs time to finish" $spread (int .Values.shutdownGraceSeconds)) }}
{{- end }}
{{- $_ := set $owned.server "drain_spread" (printf "%ds" $spread) }}
{{- end }}
{{- if .Values.tls.secretName }}
{{- $pair := dict "cert_file" "/etc/fanout-tls/tls.crt" "key_file" "/etc/fanout-tls/tls.key" }}
{{- $userTls := deepCopy (default (dict) (get (default (dict) .Values.config) "tls")) }}
{{- $_ := set $owned "tls" (mergeOverwrite $userTls (dict "certificates" (list $pair))) }}
{{- end }}
{{- $cfg := mergeOverwrite (deepCopy (default (dict) .Values.config)) $owned }}
{{- toYaml $cfg }}
{{- end }}

{{/* The preStop hook's kind: sleep (kubelet action), exec, or none. */}}
{{- define "fanout.preStopMode" -}}
{{- $mode := .Values.preStopMode | default "auto" }}
{{- if eq (int .Values.drainDelaySeconds) 0 }}none
{{- else if eq $mode "auto" }}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}sleep{{ else }}exec{{ end }}
{{- else if has $mode (list "sleep" "exec" "none") }}{{ $mode }}
{{- else }}{{ fail (printf "preStopMode must be auto, sleep, exec or none, not %q" $mode) }}
{{- end }}
{{- end }}

{{/*
Seconds from the pod's deletion to the end of the drain: preStop sleep, then the gateway's own
drain delay and shutdown grace, plus 5 s of margin. An explicit value below that is refused.
*/}}
{{- define "fanout.terminationGracePeriodSeconds" -}}
{{- $drain := int .Values.drainDelaySeconds }}
{{- $preStop := ternary 0 $drain (eq (include "fanout.preStopMode" .) "none") }}
{{- $needed := add $preStop $drain (int .Values.shutdownGraceSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $needed 5 }}
{{- else if le (int .Values.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed preStop + drainDelaySeconds + shutdownGraceSeconds (%d)" (int .Values.terminationGracePeriodSeconds) (int $needed)) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}
