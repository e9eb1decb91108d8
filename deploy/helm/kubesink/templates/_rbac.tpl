{{/*
RBAC from the rendered configuration, the same objects `kubesink rbac` generates (src/rbac.rs;
scripts/check-deploy.sh proves it for every example values file):
- resources watched everywhere (no `namespaces`): ClusterRole and ClusterRoleBinding
  <fullname>, one rule per API group, list and watch;
- resources with `namespaces`: per namespace a Role and RoleBinding <fullname> for what the
  ClusterRole does not already grant;
- a group-form entry (`group`, `kinds`): every resource of its group (`*`), or its kinds'
  plurals, and CustomResourceDefinitions cluster-wide;
- leader election: Role and RoleBinding <fullname>-leader-election in the Lease's namespace
  (get, update of the one Lease; create of Leases).
Plurals: a built-in kind's own (the table below, which a test in src/rbac/tests.rs keeps equal
to kubesink's), else the entry's `plural`, else the code generator's guess (rbac::guess_plural).
*/}}

{{/*
The plural of a [[resources]] entry: (dict "group" G "kind" K "plural" P-or-empty "builtins"
the parsed kubesink.builtinKinds).
*/}}
{{- define "kubesink.plural" -}}
{{- $key := printf "%s/%s" .group .kind -}}
{{- if hasKey .builtins $key -}}
{{- (get .builtins $key).plural -}}
{{- else if .plural -}}
{{- .plural -}}
{{- else -}}
{{- $k := lower .kind -}}
{{- $n := len $k -}}
{{- if lt $n 2 -}}
{{- $k -}}
{{- else if or (hasSuffix "s" $k) (hasSuffix "x" $k) (hasSuffix "z" $k) (hasSuffix "ch" $k) (hasSuffix "sh" $k) -}}
{{- printf "%ses" $k -}}
{{- else if and (hasSuffix "y" $k) (not (has (substr (int (sub $n 2)) (int (sub $n 1)) $k) (list "a" "e" "i" "o" "u"))) -}}
{{- printf "%sies" (trimSuffix "y" $k) -}}
{{- else if hasSuffix "fe" $k -}}
{{- printf "%sves" (trimSuffix "fe" $k) -}}
{{- else if hasSuffix "f" $k -}}
{{- printf "%sves" (trimSuffix "f" $k) -}}
{{- else -}}
{{- printf "%ss" $k -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
The rules, as YAML: {clusterWide: {GROUP: [plural...]}, namespaces: {NS: {GROUP: [plural...]}}}.
Fails, as `kubesink rbac` does, on namespaces for a cluster-scoped built-in kind.
*/}}
{{- define "kubesink.rbacRules" -}}
{{- $config := fromYaml (include "kubesink.config" .) -}}
{{- $builtins := fromYaml (include "kubesink.builtinKinds" .) -}}
{{- $cluster := dict -}}
{{- $namespaced := dict -}}
{{- range $i, $r := $config.resources -}}
{{- $group := "" -}}
{{- $plurals := list -}}
{{- if or (hasKey $r "group") $r.kinds -}}
{{- /* The group form: every resource of its group ("*" for every group), or its kinds'
     plurals; and CRDs, whose changes tell kubesink when kinds come and go. */ -}}
{{- $group = $r.group | default "*" -}}
{{- if eq $group "core" -}}{{- $group = "" -}}{{- end -}}
{{- if or (not $r.kinds) (has "*" $r.kinds) -}}
{{- $plurals = list "*" -}}
{{- else -}}
{{- range $k := $r.kinds -}}{{- $plurals = append $plurals (include "kubesink.plural" (dict "group" $group "kind" $k "plural" "" "builtins" $builtins)) -}}{{- end -}}
{{- end -}}
{{- $crds := "apiextensions.k8s.io" -}}
{{- $_ := set $cluster $crds (append (get $cluster $crds | default list) "customresourcedefinitions" | uniq | sortAlpha) -}}
{{- else -}}
{{- if contains "/" $r.api_version -}}{{- $group = first (splitList "/" $r.api_version) -}}{{- end -}}
{{- $plurals = list (include "kubesink.plural" (dict "group" $group "kind" $r.kind "plural" ($r.plural | default "") "builtins" $builtins)) -}}
{{- $builtin := get $builtins (printf "%s/%s" $group $r.kind) -}}
{{- if and $builtin (eq $builtin.scope "cluster") $r.namespaces -}}
{{- fail (printf "values.config.resources[%d].namespaces: %s %s is cluster-scoped; remove the namespaces list" $i $r.api_version $r.kind) -}}
{{- end -}}
{{- end -}}
{{- range $plural := $plurals -}}
{{- if not $r.namespaces -}}
{{- $_ := set $cluster $group (append (get $cluster $group | default list) $plural | uniq | sortAlpha) -}}
{{- else -}}
{{- range $ns := $r.namespaces -}}
{{- $rules := get $namespaced $ns | default dict -}}
{{- $_ := set $rules $group (append (get $rules $group | default list) $plural | uniq | sortAlpha) -}}
{{- $_ := set $namespaced $ns $rules -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The owner index's own watches (src/informer/owners.rs index_resources): with
     enrich = ["owner"], the workload controllers no entry follows where the entries asking
     for owners watch. */ -}}
{{- /* Nodes and Namespaces for their labels (node_labels, enrich = ["namespace"]), unless
     an entry follows them. */ -}}
{{- range $k := list (list "node" "Node" "nodes") (list "namespace" "Namespace" "namespaces") -}}
{{- $wanted := false -}}
{{- $followed := false -}}
{{- range $r := $config.resources -}}
{{- if has (index $k 0) ($r.enrich | default list) -}}
{{- if or (eq (index $k 0) "namespace") $r.node_labels -}}{{- $wanted = true -}}{{- end -}}
{{- end -}}
{{- if and (eq ($r.api_version | default "") "v1") (eq ($r.kind | default "") (index $k 1)) (ne ($r.mode | default "objects") "events") -}}{{- $followed = true -}}{{- end -}}
{{- end -}}
{{- if and $wanted (not $followed) -}}
{{- $_ := set $cluster "" (append (get $cluster "" | default list) (index $k 2) | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- $asking := list -}}
{{- range $r := $config.resources -}}
{{- if and (has "owner" ($r.enrich | default list)) (not (or (hasKey $r "group") $r.kinds)) -}}{{- $asking = append $asking $r -}}{{- end -}}
{{- end -}}
{{- if $asking -}}
{{- $all := false -}}
{{- $union := list -}}
{{- range $r := $asking -}}
{{- if not $r.namespaces -}}{{- $all = true -}}{{- else -}}{{- $union = concat $union $r.namespaces -}}{{- end -}}
{{- end -}}
{{- if $all -}}{{- $union = list -}}{{- end -}}
{{- $union = $union | uniq | sortAlpha -}}
{{- range $k := list (list "apps" "ReplicaSet" "replicasets") (list "apps" "Deployment" "deployments") (list "apps" "StatefulSet" "statefulsets") (list "apps" "DaemonSet" "daemonsets") (list "batch" "Job" "jobs") (list "batch" "CronJob" "cronjobs") -}}
{{- $group := index $k 0 -}}
{{- $covered := false -}}
{{- range $r := $config.resources -}}
{{- if and (eq ($r.api_version | default "") (printf "%s/v1" $group)) (eq ($r.kind | default "") (index $k 1)) (ne ($r.mode | default "objects") "events") -}}
{{- if not $r.namespaces -}}{{- $covered = true -}}
{{- else if not $all -}}
{{- $every := true -}}
{{- range $ns := $union -}}{{- if not (has $ns $r.namespaces) -}}{{- $every = false -}}{{- end -}}{{- end -}}
{{- if $every -}}{{- $covered = true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $covered -}}
{{- if $all -}}
{{- $_ := set $cluster $group (append (get $cluster $group | default list) (index $k 2) | uniq | sortAlpha) -}}
{{- else -}}
{{- range $ns := $union -}}
{{- $rules := get $namespaced $ns | default dict -}}
{{- $_ := set $rules $group (append (get $rules $group | default list) (index $k 2) | uniq | sortAlpha) -}}
{{- $_ := set $namespaced $ns $rules -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* What the ClusterRole grants everywhere needs no Role. */ -}}
{{- $kept := dict -}}
{{- range $ns, $rules := $namespaced -}}
{{- $left := dict -}}
{{- range $group, $plurals := $rules -}}
{{- $rest := list -}}
{{- range $p := $plurals -}}{{- if not (has $p (get $cluster $group | default list)) -}}{{- $rest = append $rest $p -}}{{- end -}}{{- end -}}
{{- if $rest -}}{{- $_ := set $left $group $rest -}}{{- end -}}
{{- end -}}
{{- if $left -}}{{- $_ := set $kept $ns $left -}}{{- end -}}
{{- end -}}
{{- toYaml (dict "clusterWide" $cluster "namespaces" $kept) -}}
{{- end }}

{{/* Built-in kinds: "GROUP/Kind": {plural, scope}; kept equal to src/rbac.rs BUILTINS. */}}
{{- define "kubesink.builtinKinds" -}}
"admissionregistration.k8s.io/MutatingWebhookConfiguration": {plural: mutatingwebhookconfigurations, scope: cluster}
"admissionregistration.k8s.io/ValidatingAdmissionPolicy": {plural: validatingadmissionpolicies, scope: cluster}
"admissionregistration.k8s.io/ValidatingAdmissionPolicyBinding": {plural: validatingadmissionpolicybindings, scope: cluster}
"admissionregistration.k8s.io/ValidatingWebhookConfiguration": {plural: validatingwebhookconfigurations, scope: cluster}
"apiextensions.k8s.io/CustomResourceDefinition": {plural: customresourcedefinitions, scope: cluster}
"apiregistration.k8s.io/APIService": {plural: apiservices, scope: cluster}
"apps/ControllerRevision": {plural: controllerrevisions, scope: namespaced}
"apps/DaemonSet": {plural: daemonsets, scope: namespaced}
"apps/Deployment": {plural: deployments, scope: namespaced}
"apps/ReplicaSet": {plural: replicasets, scope: namespaced}
"apps/StatefulSet": {plural: statefulsets, scope: namespaced}
"autoscaling/HorizontalPodAutoscaler": {plural: horizontalpodautoscalers, scope: namespaced}
"batch/CronJob": {plural: cronjobs, scope: namespaced}
"batch/Job": {plural: jobs, scope: namespaced}
"certificates.k8s.io/CertificateSigningRequest": {plural: certificatesigningrequests, scope: cluster}
"coordination.k8s.io/Lease": {plural: leases, scope: namespaced}
"/ComponentStatus": {plural: componentstatuses, scope: cluster}
"/ConfigMap": {plural: configmaps, scope: namespaced}
"/Endpoints": {plural: endpoints, scope: namespaced}
"/Event": {plural: events, scope: namespaced}
"/LimitRange": {plural: limitranges, scope: namespaced}
"/Namespace": {plural: namespaces, scope: cluster}
"/Node": {plural: nodes, scope: cluster}
"/PersistentVolume": {plural: persistentvolumes, scope: cluster}
"/PersistentVolumeClaim": {plural: persistentvolumeclaims, scope: namespaced}
"/Pod": {plural: pods, scope: namespaced}
"/PodTemplate": {plural: podtemplates, scope: namespaced}
"/ReplicationController": {plural: replicationcontrollers, scope: namespaced}
"/ResourceQuota": {plural: resourcequotas, scope: namespaced}
"/Secret": {plural: secrets, scope: namespaced}
"/Service": {plural: services, scope: namespaced}
"/ServiceAccount": {plural: serviceaccounts, scope: namespaced}
"discovery.k8s.io/EndpointSlice": {plural: endpointslices, scope: namespaced}
"events.k8s.io/Event": {plural: events, scope: namespaced}
"flowcontrol.apiserver.k8s.io/FlowSchema": {plural: flowschemas, scope: cluster}
"flowcontrol.apiserver.k8s.io/PriorityLevelConfiguration": {plural: prioritylevelconfigurations, scope: cluster}
"networking.k8s.io/IPAddress": {plural: ipaddresses, scope: cluster}
"networking.k8s.io/Ingress": {plural: ingresses, scope: namespaced}
"networking.k8s.io/IngressClass": {plural: ingressclasses, scope: cluster}
"networking.k8s.io/NetworkPolicy": {plural: networkpolicies, scope: namespaced}
"networking.k8s.io/ServiceCIDR": {plural: servicecidrs, scope: cluster}
"node.k8s.io/RuntimeClass": {plural: runtimeclasses, scope: cluster}
"policy/PodDisruptionBudget": {plural: poddisruptionbudgets, scope: namespaced}
"rbac.authorization.k8s.io/ClusterRole": {plural: clusterroles, scope: cluster}
"rbac.authorization.k8s.io/ClusterRoleBinding": {plural: clusterrolebindings, scope: cluster}
"rbac.authorization.k8s.io/Role": {plural: roles, scope: namespaced}
"rbac.authorization.k8s.io/RoleBinding": {plural: rolebindings, scope: namespaced}
"scheduling.k8s.io/PriorityClass": {plural: priorityclasses, scope: cluster}
"storage.k8s.io/CSIDriver": {plural: csidrivers, scope: cluster}
"storage.k8s.io/CSINode": {plural: csinodes, scope: cluster}
"storage.k8s.io/CSIStorageCapacity": {plural: csistoragecapacities, scope: namespaced}
"storage.k8s.io/StorageClass": {plural: storageclasses, scope: cluster}
"storage.k8s.io/VolumeAttachment": {plural: volumeattachments, scope: cluster}
{{- end }}
