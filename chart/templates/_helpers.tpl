{{- define "whale.labels" -}}
app.kubernetes.io/name: whale-operator
app.kubernetes.io/part-of: whale
{{- end -}}

{{/* the operator's rights on runs and children: the same rules in cluster mode (ClusterRole) and namespaced
mode (Role); manifests/overlays/{cluster,namespaced}/rbac.yaml hold the same */}}
{{- define "whale.runRules" -}}
# the WhaleRuns: watched by kopf (finalizer/annotations patched), read and status-patched by the reconciler
- apiGroups: [whale.dev]
  resources: [whaleruns]
  verbs: [get, list, watch, patch]
- apiGroups: [whale.dev]
  resources: [whaleruns/status]
  verbs: [patch]
# children carry an ownerReference with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)
- apiGroups: [whale.dev]
  resources: [whaleruns/finalizers]
  verbs: [update]
# children: created, watched, read after a name clash, deleted on suspend/retry
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create]
# the run's own Secret (<run>-auth: the harness host's caller token): created once, never read
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
# the weight-sync sidecar's doorbell (<run>-served, watched: its acknowledgement wakes the run), the vLLM pod's
# service account, and the Role + RoleBinding that let the sidecar stamp that one ConfigMap (get, patch: held here
# too, since a Role may grant only what its maker holds)
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create]
# inference.placement colocated: the train pod's GPUs, one DRA claim shared by trainer and vLLM
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, create]
# spec.storage.credentialsSecret: the run's own store keys, read to open ITS store (never the operator's own);
# the run's auth Secret (the vLLM API key), created once per run (docs/operator.md#store-credentials)
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# cluster.admission jobSet: a phase's vLLM server and workload as one JobSet (one Kueue Workload)
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get, list, watch, create, delete, patch]
# under a Kueue queue: the child's Workload, read for why Kueue holds or evicted it (status, Events); never written
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list]
# cluster.gangScheduling podGroup: a multi-node train's coscheduling PodGroup (scheduler-plugins)
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, create]
# the failed worker's termination message
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
# Kubernetes Events about the WhaleRuns
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}
