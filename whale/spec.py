"""The WhaleRun resource: one typed model for the spec and the status.

The same model validates a manifest for ``whale run`` and generates the CRD's OpenAPI schema
(``whale.crd``), so the cluster and the laptop accept exactly the same documents. Field names are
camelCase on the wire (Kubernetes style) and snake_case in Python. Defaults are the paper's.
Pure: no I/O, no heavy imports.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

API_GROUP = "whale.dev"
API_VERSION = "v1alpha1"
KIND = "WhaleRun"
PLURAL = "whaleruns"
SINGULAR = "whalerun"
SHORT_NAMES = ["wr"]


class _Model(BaseModel):
    """camelCase on the wire, unknown fields rejected (a typo must not be silently ignored)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
    )

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(ge=1)]
PosFloat = Annotated[float, Field(gt=0)]


class Condition(str, enum.Enum):
    """What alternates. ``whale``: fixed (E, I) per cycle; ``adaptive_whale``: phases end by patience."""

    RSFT_ONLY = "rsft_only"
    MH_ONLY = "mh_only"
    WHALE = "whale"
    ADAPTIVE_WHALE = "adaptive_whale"

    @property
    def trains_weights(self) -> bool:
        return self is not Condition.MH_ONLY

    @property
    def searches_harness(self) -> bool:
        return self is not Condition.RSFT_ONLY


# ----- schedule -----------------------------------------------------------------------------------


class AdaptiveWeight(_Model):
    """Weight-phase patience on the sliding-window mean training reward (each 0.2 epoch in the paper).

    Give each knob in epochs of D_weight or in steps, not both."""

    window_epochs: PosFloat | None = Field(None, description="sliding window of the mean reward (default 0.2 epoch)")
    window_steps: PosInt | None = Field(None, description="the window in steps")
    burn_in_epochs: Annotated[float, Field(ge=0)] | None = Field(
        None, description="never stop a weight phase before this (default 0.2 epoch)")
    burn_in_steps: NonNegInt | None = Field(None, description="burn-in in steps")
    patience_epochs: PosFloat | None = Field(
        None, description="stop after this long without a new best window mean (default 0.2 epoch)")
    patience_steps: PosInt | None = Field(None, description="patience in steps")

    @model_validator(mode="after")
    def _one_unit_each(self) -> AdaptiveWeight:
        for knob in ("window", "burn_in", "patience"):
            if getattr(self, f"{knob}_epochs") is not None and getattr(self, f"{knob}_steps") is not None:
                camel = to_camel(knob)
                raise ValueError(f"give {camel}Epochs or {camel}Steps, not both")
        return self


class AdaptiveHarness(_Model):
    """Harness-phase patience on the archive's best training score (incoming evaluation counts)."""

    min_iterations: PosInt = Field(6, description="never stop before this many iterations (incoming included)")
    patience: PosInt = Field(2, description="stop after this many iterations without a better archive best")
    max_iterations: PosInt = Field(15, description="stop after this many iterations in any case")

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveHarness:
        if self.max_iterations < self.min_iterations:
            raise ValueError(
                f"maxIterations ({self.max_iterations}) must be >= minIterations ({self.min_iterations})"
            )
        return self


class Adaptive(_Model):
    weight: AdaptiveWeight = AdaptiveWeight()
    harness: AdaptiveHarness = AdaptiveHarness()


class Schedule(_Model):
    """The weight budget and the per-cycle budgets, in epochs of D_weight or in RSFT steps.

    steps-per-epoch = round(|D_weight| / promptsPerStep); a budget in epochs becomes
    round(epochs x steps-per-epoch) steps (the paper: 74/70/64 steps per epoch, E=0.6 -> 44/42/38)."""

    total_epochs: PosFloat | None = Field(None, description="the weight budget in epochs of D_weight")
    total_steps: PosInt | None = Field(None, description="the weight budget in RSFT steps")
    weight_epochs_per_cycle: PosFloat | None = Field(None, description="E: weight budget per cycle (whale), epochs")
    weight_steps_per_cycle: PosInt | None = Field(None, description="E in steps")
    harness_iterations_per_cycle: PosInt = Field(
        6, description="I: harness iterations per cycle, the incoming harness's re-evaluation included"
    )
    mh_only_iterations: PosInt = Field(40, description="iterations of the single harness phase of mh_only")
    max_cycles: PosInt = Field(30, description="cap on cycles; the harness phase of the last cycle still runs")
    adaptive: Adaptive = Field(Adaptive(), description="patience rules of adaptive_whale")

    @model_validator(mode="after")
    def _one_unit_each(self) -> Schedule:
        if self.total_epochs is not None and self.total_steps is not None:
            raise ValueError("give totalEpochs or totalSteps, not both")
        if self.weight_epochs_per_cycle is not None and self.weight_steps_per_cycle is not None:
            raise ValueError("give weightEpochsPerCycle or weightStepsPerCycle, not both")
        return self


# ----- workloads ----------------------------------------------------------------------------------


class Sampling(_Model):
    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1, description="-1: no top-k")] = 20
    max_response_tokens: PosInt = Field(8192, description="per model call: max_tokens of one reply (the episode's "
                                        "budget, episodeTokenBudget, clamps it further)")
    episode_token_budget: PosInt | None = Field(
        8192, description="cumulative assistant (generated) tokens one episode may spend over all its model calls; "
        "each call's max_tokens is clamped to what is left, and the episode ends (end 'token_budget') when nothing "
        "is left. The paper: 8192 search QA and math, 8129 chess. null: no episode budget")
    episode_window_tokens: PosInt | None = Field(
        None, description="cap on the episode's length after its first prompt, assistant and tool/environment tokens "
        "together (verl's response_length; the paper: chess 16384, math 8192, search QA 8192 + 1024 x max turns). "
        "null: only model.maxModelLen caps it")


class RSFT(_Model):
    """Online rejection-sampling fine-tuning: one step = promptsPerStep x rolloutsPerPrompt rollouts,
    keep reward > scoreThreshold, SFT on the kept trajectories."""

    prompts_per_step: PosInt = Field(256, description="D_weight prompts per RSFT step")
    rollouts_per_prompt: PosInt = Field(8, description="rollouts sampled per prompt with the current weights")
    score_threshold: float = Field(0.5, description="keep trajectories with reward > this")
    sft_epochs: PosInt = Field(1, description="SFT epochs over each step's kept trajectories")
    mini_batch_size: PosInt = Field(64, description="trajectories per optimiser step")
    micro_batch_size_per_gpu: PosInt = Field(2, description="trajectories per forward pass (1 for chess in the paper)")
    learning_rate: PosFloat = Field(1e-7, description="1e-7 for math and chess in the paper, 1e-6 for search QA")
    lr_scheduler: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: NonNegInt = 0
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    max_grad_norm: PosFloat = 1.0
    optimizer: Literal["adamw"] = "adamw"
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto = bf16 on a GPU, fp32 on the CPU"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations (measured not to pay on an H200)")
    compile_layers: bool = Field(
        False, description="torch.compile each decoder layer (GPU): 60 % MFU at fixed lengths, 47 % at variable "
        "ones with bucket padding, against 24-39 % eager (H200, docs/performance.md)")
    pack_sequences: bool = Field(False, description="pack trajectories into full rows instead of padding")
    padding: Literal["auto", "bucket", "longest", "masked"] = Field(
        "auto",
        description="padded micro-batches: bucket = right-pad to a few fixed widths (compiled layers reuse their "
        "graphs), longest = to the longest sequence; both without attention mask (exact for causal attention, "
        "keeps the flash kernel); masked = with a padding mask; auto = bucket with compileLayers, else longest",
    )
    checkpoint_every_steps: NonNegInt = Field(
        0, description="also checkpoint every N steps for resume (0 = only at evaluation points and phase end)"
    )
    seed: int = 0
    sampling: Sampling = Sampling()
    mini_batch_scope: Literal["perRank", "global"] = Field(
        "perRank",
        description="what miniBatchSize counts. perRank (the paper's verl): the kept trajectories are first shared "
        "out over the data-parallel ranks (train.numNodes x train.gpusPerNode), then each rank cuts its share into "
        "miniBatchSize sequences, so one optimiser update covers ranks x miniBatchSize sequences and a step makes "
        "sftEpochs x ceil(ceil(kept / ranks) / miniBatchSize) updates; global: miniBatchSize sequences per update "
        "over all ranks, sftEpochs x ceil(kept / miniBatchSize) updates (ranks times more at the same learning "
        "rate). `whale plan` prints the figure")

    @model_validator(mode="after")
    def _batches(self) -> RSFT:
        if self.micro_batch_size_per_gpu > self.mini_batch_size:
            raise ValueError(
                f"microBatchSizePerGpu ({self.micro_batch_size_per_gpu}) must be <= miniBatchSize "
                f"({self.mini_batch_size})"
            )
        return self


class SecretKeyRef(_Model):
    """A key of a Kubernetes Secret; locally the value is read from the environment variable ``env``."""

    name: str
    key: str
    env: str | None = Field(None, description="environment variable holding the value for `whale run`")


class Proposer(_Model):
    """The coding agent that writes harness candidates."""

    backend: Literal["openai", "cli", "replay"] = Field(
        "openai",
        description="openai: built-in agent loop over an OpenAI-compatible chat API with tool calls; "
        "cli: an external agent command; replay: a recorded proposal script (tests/CI)",
    )
    model: str | None = None
    base_url: str | None = None
    api_key_secret: SecretKeyRef | None = None
    command: list[str] | None = Field(None, description="cli backend: argv template; {scratch} {archive} {skill}")
    script: str | None = Field(None, description="replay backend: path of the recorded proposal script")
    timeout_seconds: PosInt = 2400
    max_turns: PosInt = 40
    max_tokens: PosInt = 200_000

    @model_validator(mode="after")
    def _backend_fields(self) -> Proposer:
        if self.backend == "cli" and not self.command:
            raise ValueError("backend 'cli' needs `command` (the agent CLI's argv)")
        if self.backend == "replay" and not self.script:
            raise ValueError("backend 'replay' needs `script`")
        return self


class HarnessSearch(_Model):
    proposals_per_iteration: PosInt = Field(3, description="candidate harnesses the proposer writes per iteration")
    rollouts_per_item: PosInt = Field(1, description="rollouts per D_harness item when scoring a candidate")
    prompt_only: bool = Field(False, description="FST baseline: only the two prompt constants may change")
    smoke_test_items: PosInt = Field(4, description="D_harness items a candidate must survive before full scoring")
    candidate_timeout_seconds: PosInt = Field(3600, description="wall time to score one candidate")
    proposer: Proposer = Proposer()


class Evaluation(_Model):
    """Test mean@k at regular points of the weight budget, after every harness phase and at the end."""

    samples_per_item: PosInt = Field(8, description="k of mean@k")
    temperature: Annotated[float, Field(ge=0)] = 1.0
    interval_epochs: PosFloat | None = Field(None, description="evaluate every this many epochs (default 0.1)")
    interval_steps: PosInt | None = Field(None, description="the interval in steps")
    at_start: bool = Field(True, description="also evaluate (theta0, h0) before anything trains")
    after_harness_phase: bool = True
    max_items: PosInt | None = Field(None, description="cap the test items (smoke runs)")
    split: Literal["test", "harness", "weight"] = "test"

    @model_validator(mode="after")
    def _one_unit(self) -> Evaluation:
        if self.interval_epochs is not None and self.interval_steps is not None:
            raise ValueError("give intervalEpochs or intervalSteps, not both")
        return self


class Model(_Model):
    name: str = Field(..., description="HF model id, or a local path / store URI of a checkpoint")
    revision: str | None = Field(None, description="HF revision (branch, tag or commit)")
    served_model_name: str | None = Field(None, description="the name vLLM serves the model under")
    max_model_len: PosInt = Field(32768, description="vLLM --max-model-len")
    trust_remote_code: bool = False
    gguf_file: str | None = Field(None, description="load from this GGUF file inside `name` (CPU demo models)")
    enable_thinking: bool = Field(
        True, description="the chat template's enable_thinking: sent as chat_template_kwargs on every request "
        "(training rollouts, evaluation, harness search) and used when RSFT re-renders a trajectory; the model's "
        "thinking stays in the reply's content and carries loss like any generated token (the paper: true)")


class Data(_Model):
    """Where the domain's raw files are, and optional caps on the split sizes."""

    data_dir: str | None = Field(None, description="raw data root (default: $WHALE_DATA_DIR or ../shared/data)")
    seed: int = Field(0, description="seed of the split shuffle")
    weight_size: PosInt | None = Field(None, description="cap |D_weight|")
    harness_size: PosInt = Field(256, description="|D_harness|")
    test_size: PosInt | None = Field(
        None, description="|D_test| (per benchmark where the domain has several); unset: the domain's default")


class Storage(_Model):
    uri: str | None = Field(
        None, description="file:///path or s3://bucket/prefix; `whale run --store` overrides it"
    )
    endpoint: str | None = Field(None, description="S3 endpoint host:port (MinIO)")
    secure: bool = Field(False, description="HTTPS to the S3 endpoint")
    region: str | None = None
    credentials_secret: str | None = Field(
        None, description="Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (cluster)"
    )


class Inference(_Model):
    """How rollouts are sampled: a vLLM server (cluster) or the in-process transformers backend (CPU)."""

    backend: Literal["auto", "vllm", "transformers", "openai"] = Field(
        "auto", description="auto: vllm on a cluster, transformers in `whale run`"
    )
    base_url: str | None = Field(None, description="openai backend: an existing OpenAI-compatible endpoint")
    max_concurrency: PosInt = Field(64, description="episodes in flight against the server")
    request_timeout_seconds: PosInt = 600
    tensor_parallel_size: PosInt = Field(1, description="vLLM --tensor-parallel-size")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    tool_call_parser: str | None = Field("qwen3_coder", description="vLLM --tool-call-parser")
    extra_args: list[str] = Field(default_factory=list, description="more `vllm serve` arguments")
    reasoning_parser: str | None = Field(
        None, description="vLLM --reasoning-parser (e.g. qwen3), passed when model.enableThinking is true: the "
        "server then moves the thinking out of content into reasoning_content, so harnesses and verifiers see only "
        "the answer. null (the paper's setting): the thinking stays inline in content, as the in-process backend "
        "gives it")


class Retry(_Model):
    max_attempts: PosInt = Field(3, description="attempts per phase before the run fails")
    active_deadline_seconds: PosInt | None = None


# ----- cluster-only fields (ignored by `whale run`) -----------------------------------------------


class Resources(_Model):
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)


class Toleration(_Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class Images(_Model):
    worker: str = "ghcr.io/whale-dev/whale-worker:0.1.0"
    vllm: str = "vllm/vllm-openai:v0.24.0"
    tools: str = "ghcr.io/whale-dev/whale-tools:0.1.0"
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


class Train(_Model):
    """Train Job shape. numNodes > 1 makes the train Job an Indexed Job with torchrun rendezvous."""

    num_nodes: PosInt = 1
    gpus_per_node: NonNegInt = 1
    deepspeed_config: str | None = Field(None, description="DeepSpeed config path in the worker image")
    resources: Resources = Resources()


class Cluster(_Model):
    """Kubernetes placement for the children; `whale run` ignores all of it."""

    images: Images = Images()
    queue_name: str | None = Field(None, description="Kueue LocalQueue; labels every Job and the Deployment")
    priority_class_name: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    service_account_name: str | None = None
    worker_resources: Resources = Resources()
    inference_resources: Resources = Resources()
    model_cache_size: str = "100Gi"


# ----- the spec -----------------------------------------------------------------------------------


class WhaleRunSpec(_Model):
    domain: str = Field(..., description="a registered domain (entry-point group whale.domains)")
    condition: Condition = Field(..., description="rsft_only | mh_only | whale | adaptive_whale")
    model: Model = Field(..., description="the base model theta0")
    schedule: Schedule = Field(Schedule(), description="budgets: weight steps, E, I, patience")
    rsft: RSFT = Field(RSFT(), description="the weight phase")
    harness_search: HarnessSearch = Field(HarnessSearch(), description="the harness phase")
    evaluation: Evaluation = Field(Evaluation(), description="test mean@k")
    data: Data = Field(Data(), description="the domain's raw data and split sizes")
    storage: Storage = Field(Storage(), description="the object store every phase writes to")
    inference: Inference = Field(Inference(), description="how rollouts are sampled")
    retry: Retry = Field(Retry(), description="failure handling per phase")
    train: Train = Field(Train(), description="train Job shape (cluster)")
    cluster: Cluster = Field(Cluster(), description="Kubernetes placement (ignored by `whale run`)")
    suspend: bool = Field(False, description="true: stop every child cleanly; false again resumes")

    @model_validator(mode="after")
    def _condition_fields(self) -> WhaleRunSpec:
        sched = self.schedule
        has_budget = sched.total_epochs is not None or sched.total_steps is not None
        has_cycle = sched.weight_epochs_per_cycle is not None or sched.weight_steps_per_cycle is not None
        if self.condition.trains_weights and not has_budget:
            raise ValueError(
                f"schedule: condition {self.condition.value} trains weights and needs a weight budget: "
                "set schedule.totalEpochs or schedule.totalSteps"
            )
        if self.condition is Condition.MH_ONLY and (has_budget or has_cycle):
            raise ValueError(
                "schedule: mh_only never trains weights, so totalEpochs/totalSteps/weightEpochsPerCycle/"
                "weightStepsPerCycle can never apply; remove them (mhOnlyIterations sets its length)"
            )
        if self.condition is Condition.WHALE and not has_cycle:
            raise ValueError(
                "schedule: condition whale needs E: set schedule.weightEpochsPerCycle or "
                "schedule.weightStepsPerCycle"
            )
        if self.condition in (Condition.RSFT_ONLY, Condition.ADAPTIVE_WHALE) and has_cycle:
            raise ValueError(
                f"schedule: weightEpochsPerCycle/weightStepsPerCycle never apply to {self.condition.value} "
                "(rsft_only trains the whole budget in one phase; adaptive_whale ends phases by patience); "
                "remove them"
            )
        return self


# ----- status -------------------------------------------------------------------------------------


class RunPhase(str, enum.Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    def is_terminal(self) -> bool:
        return self in (RunPhase.SUCCEEDED, RunPhase.FAILED)


class Stage(str, enum.Enum):
    WEIGHT = "weight"
    HARNESS = "harness"
    EVAL = "eval"
    DONE = "done"


class BestEval(_Model):
    """The best test mean@k seen so far and where it came from (the paper's headline figure)."""

    mean_at_k: float
    k: int
    phase: str
    cycle: int
    step: int
    harness: str | None = None
    checkpoint: str | None = None
    rollouts_at: int = Field(0, description="training rollouts spent when this point was reached")


class Condition_(_Model):  # noqa: N801 - metav1.Condition, named apart from the run Condition enum
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


MetaCondition = Condition_


class EvalPoint(_Model):
    """One evaluation the run owes: (checkpoint, harness) at a point of the schedule."""

    phase: str
    cycle: int
    step: int
    after: Literal["start", "weight", "harness"]
    checkpoint: str | None = None
    harness: str | None = None
    rollouts_at: int = 0
    mean_at_k: float | None = Field(None, description="set when the evaluation finished")


class WhaleRunStatus(_Model):
    """What `kubectl get wr` shows, and everything ``decide()`` needs to resume a run.

    Written by one writer: the controller applying ``decide()``. Counters (attempts, failures,
    preemptions, rollouts) are owned here and never recomputed from children."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    phase: RunPhase = RunPhase.PENDING
    cycle: NonNegInt = 0
    stage: Stage | None = None
    step: NonNegInt = Field(0, description="global RSFT steps reached (latest logged step while training)")
    iteration: NonNegInt = Field(0, description="harness iterations done in the current harness phase")
    training_reward: float | None = Field(None, description="mean training reward of the latest RSFT step")
    harness_score: float | None = Field(None, description="best D_harness score in the current harness phase")
    steps_per_epoch: NonNegInt | None = None
    total_steps: NonNegInt | None = None
    current_checkpoint: str | None = Field(None, description="store key; None: the base model theta0")
    current_harness: str | None = Field(None, description="store key; None: the domain's h0")
    checkpoint_step: NonNegInt = Field(0, description="the step of currentCheckpoint")
    active_phase: str | None = Field(None, description="the main (weight/harness) phase running now")
    completed_phases: list[str] = Field(default_factory=list, description="main phases done, in order")
    attempts: dict[str, int] = Field(default_factory=dict, description="current attempt number per phase")
    failures: dict[str, int] = Field(default_factory=dict, description="failed attempts per phase")
    preemptions: NonNegInt = 0
    stop_requested: list[str] = Field(default_factory=list, description="phases asked to stop early")
    rollouts_completed: NonNegInt = Field(0, description="training rollouts of finished phases")
    rollouts_spent: NonNegInt = Field(0, description="training rollouts so far (finished + running phases)")
    evals: list[EvalPoint] = Field(default_factory=list)
    best: BestEval | None = None
    last_eval_mean: float | None = None
    reason: str | None = None
    message: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    observed_generation: int | None = None
    conditions: list[MetaCondition] = Field(default_factory=list)
