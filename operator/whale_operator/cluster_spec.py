"""The ``cluster`` section of a WhaleRun: where its pods go, read by the operator only.

The core keeps ``spec.cluster`` as an opaque mapping (whale.core.spec); these models type it, as the Kubernetes
API has them (the subset of a pod template a workload needs; every list and map bounded). The operator parses a
WhaleRun with :class:`ClusterRunSpec` (the core's spec with this section typed), `whale validate` checks the section
with :meth:`ClusterRunSpec.of`, and the CRD generator (whale_operator.crd) takes its schema from :class:`Cluster`. Errors
name ``spec.cluster.<field>`` and the fix, as every spec error does. Pure: pydantic and the core's spec only (the
CLI imports it; a contract in pyproject.toml keeps kopf and the cluster client out).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, Strict, model_validator

from whale.core.convert import MOVED_FIELDS
from whale.core.spec import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    IMAGE_REF,
    MAX_DEADLINE_S,
    QUALIFIED_NAME,
    Int64,
    K8sName,
    LabelValue,
    QualifiedName,
    Quantity,
    Resources,
    WhaleRunSpec,
    WireModel,
)

QueueName = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=DNS1123_SUBDOMAIN)]


class Toleration(WireModel):
    """A Kubernetes toleration, with the API server's own consistency rules checked up front."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.value) || self.value == '' || !has(self.operator) || self.operator != 'Exists'",
                    "message": "value must be empty when operator is Exists",
                },
                {
                    "rule": "!has(self.tolerationSeconds) || has(self.effect) && self.effect == 'NoExecute'",
                    "message": "tolerationSeconds applies only to effect NoExecute",
                },
                {
                    "rule": "has(self.key) && self.key != '' || has(self.operator) && self.operator == 'Exists'",
                    "message": "a toleration without a key must have operator Exists",
                },
            ]
        }
    )

    key: QualifiedName | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Int64 | None = Field(None, description="only with effect NoExecute")

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only to effect NoExecute")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must have operator Exists")
        return self


ImageRef = Annotated[str, Strict(), Field(min_length=1, max_length=512, pattern=IMAGE_REF)]


class Images(WireModel):
    worker: ImageRef = "ghcr.io/whale-dev/whale-worker:0.1.0"
    vllm: ImageRef = "vllm/vllm-openai:v0.24.0"
    tools: ImageRef = "ghcr.io/whale-dev/whale-tools:0.1.0"
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


# ----- per-component pod templates (cluster only) ------------------------------------------------------
# The scheduling parts of a pod template a platform team sets per component, typed as the Kubernetes API has
# them (the subset of Affinity and TopologySpreadConstraint a workload needs; every list and map bounded).

MAX_TERMS = 32
MAX_VALUES = 64
LabelKey = Annotated[str, Strict(), Field(min_length=1, max_length=317, pattern=QUALIFIED_NAME)]
NamespaceName = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=DNS1123_LABEL)]
AnnotationValue = Annotated[str, Strict(), Field(max_length=4096)]
#: a non-root uid/gid (the restricted Pod Security Standard refuses 0)
NonRootId = Annotated[int, Strict(), Field(ge=1, le=2_147_483_647)]


class NodeSelectorRequirement(WireModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[LabelValue] = Field(default_factory=list, max_length=MAX_VALUES)


class NodeSelectorTerm(WireModel):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=MAX_TERMS)
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=MAX_TERMS)


class NodeSelector(WireModel):
    node_selector_terms: list[NodeSelectorTerm] = Field(..., min_length=1, max_length=MAX_TERMS)


class PreferredSchedulingTerm(WireModel):
    weight: Annotated[int, Strict(), Field(ge=1, le=100)]
    preference: NodeSelectorTerm


class NodeAffinity(WireModel):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=MAX_TERMS
    )


class LabelSelectorRequirement(WireModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = Field(default_factory=list, max_length=MAX_VALUES)


class LabelSelector(WireModel):
    match_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_VALUES)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=MAX_TERMS)


class PodAffinityTerm(WireModel):
    label_selector: LabelSelector | None = None
    topology_key: LabelKey
    namespaces: list[NamespaceName] = Field(default_factory=list, max_length=MAX_VALUES)
    namespace_selector: LabelSelector | None = None
    match_label_keys: list[LabelKey] = Field(default_factory=list, max_length=MAX_VALUES)
    mismatch_label_keys: list[LabelKey] = Field(default_factory=list, max_length=MAX_VALUES)


class WeightedPodAffinityTerm(WireModel):
    weight: Annotated[int, Strict(), Field(ge=1, le=100)]
    pod_affinity_term: PodAffinityTerm


class PodAffinity(WireModel):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=MAX_TERMS
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=MAX_TERMS
    )


class Affinity(WireModel):
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class TopologySpreadConstraint(WireModel):
    max_skew: Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
    topology_key: LabelKey
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    label_selector: LabelSelector | None = None
    min_domains: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] | None = None
    match_label_keys: list[LabelKey] = Field(default_factory=list, max_length=MAX_VALUES)
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    node_taints_policy: Literal["Honor", "Ignore"] | None = None


class LocalObjectReference(WireModel):
    name: K8sName


class PodSecurity(WireModel):
    """The non-root identity of a component's pods (the image's user by default: worker 10001, tools 65534).
    Everything else of the security context is fixed: restricted, or the sandbox host's where a pod starts
    harness sandboxes (docs/operator.md#pod-security)."""

    run_as_user: NonRootId | None = None
    run_as_group: NonRootId | None = None
    fs_group: NonRootId | None = None


class PodPlacement(WireModel):
    """One component's pod template. Maps (nodeSelector, labels, annotations) are merged over the run-wide ones
    (spec.cluster.nodeSelector); lists and scalars given here replace the run-wide value."""

    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=64)
    tolerations: list[Toleration] | None = Field(
        None, max_length=64, description="replaces the run-wide tolerations for this component (GPU ones included)"
    )
    affinity: Affinity | None = None
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(default_factory=list, max_length=16)
    runtime_class_name: K8sName | None = Field(None, description="e.g. gvisor or kata (a RuntimeClass of the cluster)")
    priority_class_name: K8sName | None = None
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list, max_length=16)
    labels: dict[QualifiedName, LabelValue] = Field(
        default_factory=dict, max_length=64, description="pod labels (the operator's own labels win a clash)"
    )
    annotations: dict[QualifiedName, AnnotationValue] = Field(default_factory=dict, max_length=64)
    resources: Resources | None = Field(
        None,
        description="replaces the component's resources (train.resources, cluster.workerResources, "
        "cluster.inferenceResources, a tool's own requests); GPUs still come from train.gpusPerNode and "
        "inference.tensorParallelSize",
    )
    pod_security: PodSecurity = PodSecurity()


class Placement(WireModel):
    """Per-component pod templates: each inherits the run-wide placement (spec.cluster.nodeSelector,
    tolerations, priorityClassName) and overrides it. Run-wide tolerations of GPU taints (a key naming a GPU,
    e.g. nvidia.com/gpu) reach only pods that request a GPU."""

    train: PodPlacement = Field(PodPlacement(), description="the weight phase's Job (RSFT)")
    inference: PodPlacement = Field(PodPlacement(), description="the vLLM Deployment")
    workers: PodPlacement = Field(PodPlacement(), description="harness-search, evaluation and prepare Jobs")
    tools: PodPlacement = Field(PodPlacement(), description="the domain's tool services (retriever, code sandbox)")
    harness: PodPlacement = Field(
        PodPlacement(),
        description="the run's harness pod, where harness files run (e.g. runtimeClassName: gvisor)",
    )


#: a Job's default wall time when spec.execution.retry.activeDeadlineSeconds is unset: 7 days
DEFAULT_ACTIVE_DEADLINE_S = 7 * 24 * 3600
#: how long a finished child Job stays for `kubectl logs` before the TTL controller deletes it: 7 days
DEFAULT_FINISHED_TTL_S = 7 * 24 * 3600


class Lifecycle(WireModel):
    """How long children live."""

    active_deadline_seconds: Annotated[int, Strict(), Field(ge=1, le=MAX_DEADLINE_S)] = Field(
        DEFAULT_ACTIVE_DEADLINE_S,
        description="a Job's wall time when spec.execution.retry.activeDeadlineSeconds is unset "
        "(7 days); a weight phase longer than that needs retry.activeDeadlineSeconds",
    )
    ttl_seconds_after_finished: Annotated[int, Strict(), Field(ge=0, le=MAX_DEADLINE_S)] | None = Field(
        DEFAULT_FINISHED_TTL_S,
        description="finished Jobs (and their pods, logs) are deleted this long after they "
        "end (7 days); the store keeps every result. null: kept until the run is deleted",
    )


class Cluster(WireModel):
    """Kubernetes placement for the children; `whale run` ignores all of it."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        """A field that moved out (whale.core.convert.MOVED_FIELDS) is read where it now lives unless that is set
        too: then this one is a leftover, refused with where it went (not as an unknown field)."""
        if isinstance(data, dict):
            for old, new in MOVED_FIELDS:
                if old[0] == "cluster" and old[1] in data:
                    raise ValueError(f"{old[1]} moved to spec.{'.'.join(new)}: set it there only")
        return data

    images: Images = Images()
    queue_name: QueueName | None = Field(
        None, description="Kueue LocalQueue; labels every Job, phase JobSet (see admission) and Deployment"
    )
    priority_class_name: K8sName | None = None
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=64)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    service_account_name: K8sName | None = None
    worker_resources: Resources = Resources()
    inference_resources: Resources = Resources()
    model_cache_size: Quantity = "100Gi"
    placement: Placement = Field(
        Placement(), description="per-component pod templates (train, inference, workers, tools)"
    )
    lifecycle: Lifecycle = Field(Lifecycle(), description="Job deadlines and how long finished Jobs stay")
    model_cache_claim_name: K8sName | None = Field(
        None,
        description="a PersistentVolumeClaim for vLLM's model cache (/models: weights and the servers' compile "
        "caches) instead of an emptyDir of modelCacheSize; with more than one inference replica, or a colocated "
        "placement (its train pods mount it too), it must be ReadWriteMany",
    )
    admission: Literal["auto", "perChild", "jobSet"] = Field(
        "auto",
        description="how a phase reaches the cluster: perChild = a Job per phase beside one run-wide vLLM "
        "Deployment (each admitted by Kueue on its own); jobSet = one JobSet per phase holding its vLLM server and "
        "its workload, admitted by Kueue as one unit (needs JobSet >= 0.8 installed; no run-wide vLLM Deployment); "
        "auto = jobSet when queueName is set and the vLLM server is placed separately, else perChild",
    )
    scheduler_name: K8sName | None = Field(
        None, description="the scheduler of every pod of the run (e.g. scheduler-plugins' coscheduling scheduler)"
    )
    gang_scheduling: Literal["none", "podGroup"] = Field(
        "none",
        description="podGroup: a multi-node train Job (train.numNodes > 1) gets a scheduler-plugins PodGroup "
        "(scheduling.x-k8s.io/v1alpha1, minMember = its pods), so its pods are placed all together or not at all",
    )


class ClusterRunSpec(WhaleRunSpec):
    """A WhaleRun's spec as the operator reads it: the core's, with ``cluster`` typed (the core keeps it opaque)."""

    cluster: Cluster = Field(  # type: ignore[assignment]  # the core's opaque mapping, typed where it is read
        Cluster(), description="Kubernetes placement (ignored by `whale run`)"
    )

    @classmethod
    def of(cls, spec: WhaleRunSpec) -> ClusterRunSpec:
        """``spec`` (validated by the core) with its cluster section checked; raises pydantic's ValidationError,
        its errors at ``cluster.<field>`` as when the whole spec is parsed here."""
        return cls.model_validate({name: getattr(spec, name) for name in WhaleRunSpec.model_fields})

    @model_validator(mode="after")
    def _admission_fields(self) -> ClusterRunSpec:
        inf = self.execution.inference
        if self.cluster.admission == "jobSet" and (inf.backend not in ("auto", "vllm") or inf.placement != "separate"):
            raise ValueError(
                "cluster.admission: jobSet puts each phase's own vLLM server beside its workload; it needs "
                "execution.inference.backend vllm (or auto) and execution.inference.placement separate: set them, "
                "or admission auto"
            )
        return self


def cluster_warnings(spec: ClusterRunSpec) -> list[str]:
    """What `whale validate` says of a cluster section that loads but may not do what it seems to."""
    out = []
    if spec.cluster.queue_name and spec.execution.inference.placement == "colocated" and spec.condition.trains_weights:
        # the only time before the queue's GPU quota is silently bypassed
        out.append(
            "spec.cluster.queueName with spec.execution.inference.placement colocated: the weight phase's GPUs are a "
            "DRA ResourceClaim (DeviceClass gpu.nvidia.com), which Kueue counts as 0 GPUs unless its Configuration "
            "maps that DeviceClass (resources.deviceClassMappings, feature gate DynamicResourceAllocation); see "
            "docs/operator.md#kueue-one-admission-unit-per-phase"
        )
    return out
