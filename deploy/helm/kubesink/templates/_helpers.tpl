{{/* Names: <release>-kubesink, or the release name when it contains "kubesink". */}}
{{- define "kubesink.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "kubesink.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "kubesink.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kubesink.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: set it when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{- define "kubesink.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubesink.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: bridge
{{- end }}

{{- define "kubesink.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kubesink.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The metrics port: the port of config.server.listen, else metrics.port. */}}
{{- define "kubesink.metricsPort" -}}
{{- $listen := dig "server" "listen" "" .Values.config -}}
{{- if $listen -}}
{{- regexFind "[0-9]+$" $listen | required (printf "values.config.server.listen: %q has no port" $listen) -}}
{{- else -}}
{{- .Values.metrics.port -}}
{{- end -}}
{{- end }}

{{/*
kubesink's configuration as YAML: values.config with what the chart knows filled in where it
is not set (server.listen on metrics.port; with leader election, the Lease named after the
release in the release's namespace). Fails on a credential in clear.
*/}}
{{- define "kubesink.config" -}}
{{- $c := deepCopy .Values.config -}}
{{- include "kubesink.noClearCredentials" (dict "value" $c "path" "values.config") -}}
{{- if not $c.resources -}}
{{- fail "values.config.resources: list the resources to watch (the chart derives the RBAC from them)" -}}
{{- end -}}
{{- $cluster := get $c "cluster" | default dict -}}
{{- if and (not $c.clusters) (eq (upper (trim (toString (get $cluster "name")))) "CHANGE-ME") -}}
{{- fail "values.config.cluster.name is still the placeholder CHANGE-ME: set it to this cluster's name, carried by every message (--set config.cluster.name=prod-eu-1, or in your values file); kubesink refuses to start with it" -}}
{{- end -}}
{{- $leading := dig "leader_election" "enabled" false $c -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $leading) -}}
{{- fail (printf "values.replicaCount is %v but config.leader_election.enabled is not true: replicas without leader election would all watch and emit every change; set replicaCount: 1, or config.leader_election.enabled: true" .Values.replicaCount) -}}
{{- end -}}
{{- if dig "leader_election" "scale_out" false $c -}}
{{- $backend := dig "state" "backend" "none" $c -}}
{{- if not (has $backend (list "nats" "kafka")) -}}
{{- fail (printf "values.config.leader_election.scale_out needs config.state.backend nats or kafka (it is %v): a cluster moves between replicas and its next holder resumes from its saved state (see examples/scale-out.yaml)" $backend) -}}
{{- end -}}
{{- end -}}
{{- $server := get $c "server" | default dict -}}
{{- if not (hasKey $server "listen") -}}
{{- $_ := set $server "listen" (printf "0.0.0.0:%v" .Values.metrics.port) -}}
{{- end -}}
{{- $_ := set $c "server" $server -}}
{{- $le := get $c "leader_election" | default dict -}}
{{- if $le.enabled -}}
{{- if not (hasKey $le "lease_name") -}}{{- $_ := set $le "lease_name" (include "kubesink.fullname" .) -}}{{- end -}}
{{- if not (hasKey $le "lease_namespace") -}}{{- $_ := set $le "lease_namespace" .Release.Namespace -}}{{- end -}}
{{- $_ := set $c "leader_election" $le -}}
{{- end -}}
{{- toYaml $c -}}
{{- end }}

{{/*
kubesink.toml. Helm reads numbers in values as float64, and toToml would write 9090 as
9090.0 (and 8388608 as 8.388608e+06), which kubesink's integer keys reject; so integral
numbers become integers first (kubesink's float keys accept integers).
*/}}
{{- define "kubesink.toml" -}}
{{- $c := fromYaml (include "kubesink.config" .) -}}
{{- include "kubesink.integers" $c -}}
{{- toToml $c -}}
{{- end }}

{{/* In place: every integral float64 of a map (nested maps and lists too) becomes an int64. */}}
{{- define "kubesink.integers" -}}
{{- $m := . -}}
{{- range $k, $v := $m -}}
{{- if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) -}}
{{- $_ := set $m $k (int64 $v) -}}
{{- else if kindIs "map" $v -}}
{{- include "kubesink.integers" $v -}}
{{- else if kindIs "slice" $v -}}
{{- $out := list -}}
{{- range $e := $v -}}
{{- if kindIs "map" $e -}}
{{- include "kubesink.integers" $e -}}
{{- $out = append $out $e -}}
{{- else if and (kindIs "float64" $e) (eq $e (float64 (int64 $e))) -}}
{{- $out = append $out (int64 $e) -}}
{{- else -}}
{{- $out = append $out $e -}}
{{- end -}}
{{- end -}}
{{- $_ := set $m $k $out -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
Credentials never come from values in clear: a secret key of kubesink's configuration (the
`Secret` keys of config/kubesink.toml) given as a string, number or boolean fails; it must be
{ env: NAME } (secretEnv) or { file: PATH }
(secretMounts). Walks maps and lists; (dict "value" V "path" "values.config").
*/}}
{{- define "kubesink.noClearCredentials" -}}
{{- $path := .path -}}
{{- if kindIs "map" .value -}}
{{- range $k, $v := .value -}}
{{- if and (has $k (list "password" "token" "nkey_seed" "sasl_password" "ssl_key_password")) (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) -}}
{{- fail (printf "%s.%s: a credential in clear; write %s: {env: NAME} with secretEnv, or %s: {file: PATH} with secretMounts, naming an existing Secret" $path $k $k $k) -}}
{{- end -}}
{{- include "kubesink.noClearCredentials" (dict "value" $v "path" (printf "%s.%s" $path $k)) -}}
{{- end -}}
{{- else if kindIs "slice" .value -}}
{{- range $i, $v := .value -}}
{{- include "kubesink.noClearCredentials" (dict "value" $v "path" (printf "%s[%d]" $path $i)) -}}
{{- end -}}
{{- end -}}
{{- end }}
