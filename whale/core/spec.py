"""The WhaleRun resource: one typed model for the spec and the status.

The same model validates a manifest for ``whale run`` and gives the CRD its OpenAPI schema (the operator's
generator, ``whale_operator.crd``, adds the ``cluster`` section, whose models are the operator's), so the cluster and
the laptop accept exactly the same documents. Field names are
camelCase on the wire (Kubernetes style) and snake_case in Python. Defaults are the paper's.
Pure: no I/O, no heavy imports.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, model_validator
from pydantic.alias_generators import to_camel

from whale.core import egress
from whale.core.convert import convert_v1alpha1_spec, is_v1alpha1_spec, move_fields

API_GROUP = "whale.dev"
API_VERSION = "v1alpha2"
#: the previous version: still read, converted on load (whale.core.convert); `whale migrate` rewrites it
PREVIOUS_API_VERSION = "v1alpha1"
KIND = "WhaleRun"
PLURAL = "whaleruns"
SINGULAR = "whalerun"
SHORT_NAMES = ["wr"]


class WireModel(BaseModel):
    """camelCase on the wire, unknown fields rejected (a typo must not be silently ignored), every
    float finite (``.inf`` and ``.nan`` parse as YAML floats but mean nothing as a budget or a rate)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
        allow_inf_nan=False,
    )

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ----- bounds -------------------------------------------------------------------------------------
# Every number a manifest gives is bounded: generous limits, far above the paper's values (in
# brackets), so that a typo or a hostile manifest fails validation instead of asking a controller
# for unbounded time or memory. The CRD carries the same bounds as minimum/maximum. Integers are
# strict: YAML's `true` or `1.5e3` is not a count. docs/reference.md lists them.

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: total weight budget, E, warm-up, checkpoint cadence, eval interval [paper: ~300 steps]
MAX_STEPS = 1_000_000
#: any budget in epochs of D_weight [paper: 4-6]
MAX_EPOCHS = 10_000.0
#: harness iterations of one phase (I, mh_only's N, the adaptive bounds) [paper: 6 / 40-60 / 15]
MAX_ITERATIONS = 1_000
#: cycles of a run [paper: 30]
MAX_CYCLES = 500
#: test-set evaluation points inside the weight budget (each is a full mean@k pass and an entry of
#: the run's status, which the Kubernetes API keeps under ~1.5 MiB) [paper: 40-60]
MAX_EVALUATION_POINTS = 1_000
#: split sizes and item caps [the largest raw split here: ~4M Lichess puzzles]
MAX_ITEMS = 100_000_000
#: prompts per step and batch sizes [paper: 256 / 64 / 2]
MAX_BATCH = 1_000_000
#: rollouts per prompt, per harness item, samples per test item [paper: 8 / 1 / 8]
MAX_SAMPLES = 1_024
#: tokens of a reply or a context [paper: 8192 / 16384 / 32768]
MAX_TOKENS = 16_777_216
#: the proposer's token budget [paper: 200000]
MAX_PROPOSER_TOKENS = 1_000_000_000
#: a timeout of one call, candidate or agent session: 7 days [paper: 2400 s]
MAX_TIMEOUT_S = 7 * 24 * 3600
#: a Job's active deadline: a year
MAX_DEADLINE_S = 366 * 24 * 3600
#: sampling temperature [paper: 1.0]
MAX_TEMPERATURE = 10.0
#: learning rate [paper: 1e-7 / 1e-6]
MAX_LEARNING_RATE = 1.0

#: lax (the status also reads these from what controllers wrote); spec fields use the strict ones below
NonNegInt = Annotated[int, Field(ge=0, le=INT64_MAX)]
PosInt = Annotated[int, Field(ge=1, le=INT64_MAX)]
PosFloat = Annotated[float, Field(gt=0)]
Int64 = Annotated[int, Strict(), Field(ge=INT64_MIN, le=INT64_MAX)]
StrictBool = Annotated[bool, Strict()]
Steps = Annotated[int, Strict(), Field(ge=1, le=MAX_STEPS)]
StepsOrZero = Annotated[int, Strict(), Field(ge=0, le=MAX_STEPS)]
Epochs = Annotated[float, Strict(), Field(gt=0, le=MAX_EPOCHS)]
EpochsOrZero = Annotated[float, Strict(), Field(ge=0, le=MAX_EPOCHS)]
Iterations = Annotated[int, Strict(), Field(ge=1, le=MAX_ITERATIONS)]
Items = Annotated[int, Strict(), Field(ge=1, le=MAX_ITEMS)]
Batch = Annotated[int, Strict(), Field(ge=1, le=MAX_BATCH)]
Samples = Annotated[int, Strict(), Field(ge=1, le=MAX_SAMPLES)]
Tokens = Annotated[int, Strict(), Field(ge=1, le=MAX_TOKENS)]
Seconds = Annotated[int, Strict(), Field(ge=1, le=MAX_TIMEOUT_S)]
Temperature = Annotated[float, Strict(), Field(ge=0, le=MAX_TEMPERATURE)]
Fraction = Annotated[float, Strict(), Field(gt=0, le=1)]

# ----- Kubernetes names and values (the API server's own rules, as patterns the CRD repeats) --------

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: label keys and resource names: an optional DNS subdomain prefix and '/', then a name
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
#: apimachinery's resource.Quantity, without a sign: '8', '500m', '32Gi', '1.5', '2e3'
QUANTITY = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][-+]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: a download address of a data source: http(s) only, no whitespace, no credentials (user:password@)
SOURCE_URL = r"^https?://[^/@\s?#]+([/?#]\S*)?$"
#: an endpoint or store address: a scheme, then no credentials (user:password@) before the path, no whitespace
URL = r"^[A-Za-z][-A-Za-z0-9+.]*://[^/@\s?#]*([/?#]\S*)?$"
#: host[:port] (an S3 endpoint), optionally with a scheme: no credentials, no whitespace
ENDPOINT = r"^([A-Za-z][-A-Za-z0-9+.]*://)?[^/@\s?#]+/?$"
#: a container image reference: registry/name[:tag][@digest]; no whitespace or control characters
IMAGE_REF = r"^[A-Za-z0-9][-A-Za-z0-9._/:@+]*$"
_NO_CREDENTIALS = (
    "no credentials in it (user:password@): put them in a Secret (storage.credentialsSecret, proposer.apiKeySecret)"
)
SHA256_HEX = r"^[0-9a-f]{64}$"
#: an absolute path other than "/" itself, without a trailing "/"
ABSOLUTE_PATH = r"^/[^\x00]*[^/\x00]$"
#: a path inside a folder: relative (no leading '/' or '~'), no '..' component, no NUL, no newline
RELATIVE_PATH = (
    r"^([^/~.\x00\n]|\.[^./\x00\n]|\.\.[^/\x00\n])[^/\x00\n]*(/([^/.\x00\n]|\.[^./\x00\n]|\.\.[^/\x00\n])[^/\x00\n]*)*$"
)

#: what each pattern means, for error messages (``whale.manifest`` turns a pattern mismatch into this)
PATTERN_HINTS: dict[str, str] = {
    DNS1123_LABEL: "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a "
    "letter or digit",
    DNS1123_SUBDOMAIN: "must be a Kubernetes object name (DNS-1123 subdomain): lowercase letters, digits, '-' "
    "and '.', starting and ending with a letter or digit",
    QUALIFIED_NAME: "must be a qualified name like 'memory', 'nvidia.com/gpu' or 'kubernetes.io/os': an optional DNS prefix "
    "and '/', then letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
    LABEL_VALUE: "must be a label value: letters, digits, '-', '_' and '.', starting and ending with a letter "
    "or digit (or empty)",
    SECRET_KEY: "must be a Secret key: letters, digits, '-', '_' and '.'",
    QUANTITY: "must be a Kubernetes quantity like '8', '500m', '32Gi' or '1.5' (quote it in YAML)",
    ENV_NAME: "must be an environment variable name: letters, digits and '_', not starting with a digit",
    SOURCE_URL: f"must be an http:// or https:// URL without spaces and {_NO_CREDENTIALS}",
    URL: f"must be a URL (scheme://host/path) without spaces and {_NO_CREDENTIALS}",
    ENDPOINT: f"must be host[:port] (optionally with http:// or https://), {_NO_CREDENTIALS}",
    IMAGE_REF: "must be a container image reference (registry/name:tag or name@sha256:digest): no spaces, "
    "newlines or quotes",
    SHA256_HEX: "must be a SHA-256 digest: 64 lowercase hexadecimal digits",
    ABSOLUTE_PATH: "must be an absolute path like /opt/agent (not '/' itself, no trailing '/')",
    RELATIVE_PATH: "must be a path inside the folder it names a file of: relative (no leading '/' or '~'), "
    "no '.' or '..' component, no newline",
}

#: variables that change how a program loads, runs, finds files or reaches the network, or that the
#: workloads read themselves: a Secret's value must never land in one of them (case-insensitive)
DANGEROUS_ENV_PREFIXES = (
    "LD_",
    "DYLD_",
    "PYTHON",
    "BASH_",
    "GCONV_",
    "GLIBC_",
    "MALLOC_",
    "NODE_",
    "PERL",
    "RUBY",
    "JAVA_",
    "_JAVA_",
    "LC_",
    "SSL_",
    "AWS_",
    "KUBERNETES_",
    "WHALE_",
)
DANGEROUS_ENV_NAMES = (
    "PATH",
    "HOME",
    "USER",
    "SHELL",
    "ENV",
    "IFS",
    "PS4",
    "CDPATH",
    "TMPDIR",
    "TMP",
    "TEMP",
    "LANG",
    "LANGUAGE",
    "TZ",
    "PWD",
    "HOSTNAME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)
#: the one WHALE_ variable meant for a Secret (the proposer's key; ``whale.metaharness.proposer``)
PROPOSER_KEY_ENV = "WHALE_PROPOSER_API_KEY"


def _safe_env_name(name: str) -> str:
    upper = name.upper()
    if upper != PROPOSER_KEY_ENV and (upper in DANGEROUS_ENV_NAMES or upper.startswith(DANGEROUS_ENV_PREFIXES)):
        raise ValueError(
            f"{name[:64]!r} would put the Secret's value where it changes how the worker's programs load or run "
            f"(names like {', '.join(DANGEROUS_ENV_NAMES[:3])} and prefixes like "
            f"{', '.join(DANGEROUS_ENV_PREFIXES[:4])} are refused): use a plain name such as {PROPOSER_KEY_ENV} "
            "or OPENAI_API_KEY"
        )
    return name


def _env_deny_schema() -> dict[str, Any]:
    """The same refusal for the CRD: a ``not pattern`` (RE2) plus one CEL rule for the WHALE_ exception."""
    prefixes = "|".join(p for p in DANGEROUS_ENV_PREFIXES if p != "WHALE_")
    names = "|".join(DANGEROUS_ENV_NAMES)
    return {
        "not": {"pattern": f"(?i)^(({prefixes}).*|({names}))$"},
        "x-kubernetes-validations": [
            {
                "rule": f"!self.upperAscii().startsWith('WHALE_') || self.upperAscii() == '{PROPOSER_KEY_ENV}'",
                "message": f"WHALE_ variables are the workloads' own; only {PROPOSER_KEY_ENV} may hold a Secret",
            }
        ],
    }


K8sName = Annotated[str, Strict(), Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)]
#: a Kueue LocalQueue: an object name that is also a label value (63 characters at most)
QualifiedName = Annotated[str, Strict(), Field(min_length=1, max_length=317, pattern=QUALIFIED_NAME)]
LabelValue = Annotated[str, Strict(), Field(max_length=63, pattern=LABEL_VALUE)]
Quantity = Annotated[str, Strict(), Field(min_length=1, max_length=64, pattern=QUANTITY)]
EnvName = Annotated[
    str,
    Strict(),
    Field(min_length=1, max_length=128, pattern=ENV_NAME, json_schema_extra=_env_deny_schema()),
    AfterValidator(_safe_env_name),
]


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


class AdaptiveWeight(WireModel):
    """Weight-phase patience on the sliding-window mean training reward (each 0.2 epoch in the paper).

    Give each knob in epochs of D_weight or in steps, not both."""

    window_epochs: Epochs | None = Field(None, description="sliding window of the mean reward (default 0.2 epoch)")
    window_steps: Steps | None = Field(None, description="the window in steps")
    burn_in_epochs: EpochsOrZero | None = Field(
        None, description="never stop a weight phase before this (default 0.2 epoch)"
    )
    burn_in_steps: StepsOrZero | None = Field(None, description="burn-in in steps")
    patience_epochs: Epochs | None = Field(
        None, description="stop after this long without a new best window mean (default 0.2 epoch)"
    )
    patience_steps: Steps | None = Field(None, description="patience in steps")

    @model_validator(mode="after")
    def _one_unit_each(self) -> AdaptiveWeight:
        for knob in ("window", "burn_in", "patience"):
            if getattr(self, f"{knob}_epochs") is not None and getattr(self, f"{knob}_steps") is not None:
                camel = to_camel(knob)
                raise ValueError(f"give {camel}Epochs or {camel}Steps, not both")
        return self


class AdaptiveHarness(WireModel):
    """Harness-phase patience on the archive's best training score (counted as the paper: see each field)."""

    min_iterations: Iterations = Field(
        6,
        description="never stop before this many iterations, the incoming harness's re-evaluation included "
        "(the paper: 6 = the incoming evaluation + 5 proposer iterations)",
    )
    patience: Iterations = Field(
        2, description="stop after this many iterations in a row without a better archive best"
    )
    max_iterations: Iterations = Field(
        15,
        description="stop after this many PROPOSER iterations in any case; the incoming harness's "
        "re-evaluation comes on top (the paper: 15, so at most 16 iterations in the phase's archive)",
    )

    @property
    def max_archive_iterations(self) -> int:
        """The most iterations a phase's archive holds: the proposer iterations plus the incoming evaluation."""
        return self.max_iterations + 1

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveHarness:
        if self.max_archive_iterations < self.min_iterations:
            raise ValueError(
                f"maxIterations ({self.max_iterations} proposer iterations, {self.max_archive_iterations} with the "
                f"incoming evaluation) must allow minIterations ({self.min_iterations}, the incoming evaluation "
                f"included): raise maxIterations to at least {self.min_iterations - 1}"
            )
        return self


class Adaptive(WireModel):
    weight: AdaptiveWeight = AdaptiveWeight()
    harness: AdaptiveHarness = AdaptiveHarness()


class Schedule(WireModel):
    """The weight budget and the per-cycle budgets, in epochs of D_weight or in RSFT steps.

    steps-per-epoch = round(|D_weight| / promptsPerStep); a budget in epochs becomes
    round(epochs x steps-per-epoch) steps (the paper: 74/70/64 steps per epoch, E=0.6 -> 44/42/38)."""

    total_epochs: Epochs | None = Field(
        None, description=f"the weight budget in epochs of D_weight (at most {MAX_STEPS} steps once converted)"
    )
    total_steps: Steps | None = Field(None, description="the weight budget in RSFT steps")
    weight_epochs_per_cycle: Epochs | None = Field(None, description="E: weight budget per cycle (whale), epochs")
    weight_steps_per_cycle: Steps | None = Field(None, description="E in steps")
    harness_iterations_per_cycle: Iterations = Field(
        6,
        description="I (whale): iterations of each harness phase, the incoming harness's re-evaluation included "
        "(the paper's I = 6 = the incoming evaluation + 5 proposer iterations)",
    )
    mh_only_iterations: Iterations = Field(
        40,
        description="mh_only: PROPOSER iterations of its single harness phase; the incoming (h0) evaluation "
        "comes on top, so the archive holds mhOnlyIterations + 1 iterations (the paper: 40 search QA, 60 math, "
        "40 chess)",
    )
    max_cycles: Annotated[int, Strict(), Field(ge=1, le=MAX_CYCLES)] = Field(
        30, description="cap on cycles; the harness phase of the last cycle still runs"
    )
    adaptive: Adaptive = Field(Adaptive(), description="patience rules of adaptive_whale")

    @model_validator(mode="after")
    def _one_unit_each(self) -> Schedule:
        if self.total_epochs is not None and self.total_steps is not None:
            raise ValueError("give totalEpochs or totalSteps, not both")
        if self.weight_epochs_per_cycle is not None and self.weight_steps_per_cycle is not None:
            raise ValueError("give weightEpochsPerCycle or weightStepsPerCycle, not both")
        return self


# ----- workloads ----------------------------------------------------------------------------------


class Sampling(WireModel):
    temperature: Temperature = 1.0
    top_p: Fraction = 1.0
    top_k: Annotated[int, Strict(), Field(ge=-1, le=MAX_TOKENS, description="-1: no top-k")] = 20
    max_response_tokens: Tokens = Field(
        8192,
        description="per model call: max_tokens of one reply (the episode's "
        "budget, episodeTokenBudget, clamps it further)",
    )
    episode_token_budget: Tokens | None = Field(
        8192,
        description="cumulative assistant (generated) tokens one episode may spend over all its model calls; "
        "each call's max_tokens is clamped to what is left, and the episode ends (end 'token_budget') when nothing "
        "is left. The paper: 8192 search QA and math, 8129 chess. null: no episode budget",
    )
    episode_window_tokens: Tokens | None = Field(
        None,
        description="cap on the episode's length after its first prompt, assistant and tool/environment tokens "
        "together (verl's response_length; the paper: chess 16384, math 8192, search QA 8192 + 1024 x max turns). "
        "null: only model.maxModelLen caps it",
    )


#: spec.experiment.rsft.keepCheckpoints (whale.core.retention)
KeepCheckpoints = Literal["lastAndBest", "all"]


class RSFT(WireModel):
    """Online rejection-sampling fine-tuning: one step = promptsPerStep x rolloutsPerPrompt rollouts,
    keep reward > scoreThreshold, SFT on the kept trajectories."""

    prompts_per_step: Batch = Field(256, description="D_weight prompts per RSFT step")
    rollouts_per_prompt: Samples = Field(8, description="rollouts sampled per prompt with the current weights")
    score_threshold: Annotated[float, Strict(), Field(ge=0, lt=1)] = Field(
        0.5,
        description="keep trajectories with reward > this; rewards are in [0, 1], so it lies in [0, 1): "
        "1 or more keeps nothing (no step would train), below 0 keeps everything, failed episodes included",
    )
    sft_epochs: Annotated[int, Strict(), Field(ge=1, le=100)] = Field(
        1, description="SFT epochs over each step's kept trajectories"
    )
    mini_batch_size: Batch = Field(64, description="trajectories per optimiser step")
    micro_batch_size_per_gpu: Batch = Field(2, description="trajectories per forward pass (1 for chess in the paper)")
    learning_rate: Annotated[float, Strict(), Field(gt=0, le=MAX_LEARNING_RATE)] = Field(
        1e-7, description="1e-7 for math and chess in the paper, 1e-6 for search QA"
    )
    lr_scheduler: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: StepsOrZero = 0
    weight_decay: Annotated[float, Strict(), Field(ge=0, le=10)] = Field(
        0.01, description="AdamW weight decay (the paper: 0.01, verl's default)"
    )
    max_grad_norm: Annotated[float, Strict(), Field(gt=0, le=1e6)] = 1.0
    optimizer: Literal["adamw"] = "adamw"
    precision: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto = bf16 on a GPU, fp32 on the CPU")
    gradient_checkpointing: StrictBool = Field(
        False,
        description="recompute each decoder layer's activations in the backward pass: far less memory per token "
        "(Qwen3.5-2B keeps ~4.1 MiB a token without it, -4B ~8.3 MiB, measured on an H200) for about a third more "
        "compute; the reference's search QA and chess launchers enable it, its math launcher does not",
    )
    compile_layers: StrictBool = Field(
        False,
        description="torch.compile each decoder layer and the LM head's cross-entropy (GPU): Qwen3.5-2B packed by "
        "tokens 53.6 % MFU, Qwen3.5-4B 51.8 % (H200, docs/performance.md)",
    )
    pack_sequences: StrictBool = Field(False, description="pack trajectories into full rows instead of padding")
    sequences: Literal["trajectory", "turn"] = Field(
        "trajectory",
        description="training sequences of a multi-turn trajectory whose chat template rewrites history (Qwen3-"
        "style templates drop earlier thinking before a new user message, as in chess): trajectory = one sequence "
        "per trajectory, the loss on the model's turns only, earlier thinking kept in context (the reference's "
        "verl); turn = one sequence per model turn with exactly the context generation saw (more sequences, so "
        "more optimiser updates than whale plan counts). Templates that do not rewrite history give one sequence "
        "either way",
    )
    padding: Literal["auto", "bucket", "longest", "masked"] = Field(
        "auto",
        description="padded micro-batches: bucket = right-pad to a few fixed widths (compiled layers reuse their "
        "graphs), longest = to the longest sequence; both without attention mask (exact for causal attention, "
        "keeps the flash kernel); masked = with a padding mask; auto = bucket with compileLayers, else longest",
    )
    checkpoint_every_steps: StepsOrZero = Field(
        0, description="also checkpoint every N steps for resume (0 = only at evaluation points and phase end)"
    )
    step_resume: Literal["auto", "on", "replay", "off"] = Field(
        "auto",
        description="what an interrupted weight phase resumes from, so it goes on at the next step: on = a light "
        "resume point after every step (a checkpoint of the weights and optimiser; the one before it deleted); "
        "replay = after every step its data position and kept trajectories (token ids, a few MB): the resume "
        "loads the last checkpoint and trains the steps since again on their kept trajectories, sampling none of "
        "them again; auto = on when the weights and Adam moments take at most 4 GiB (12 bytes a parameter: "
        "SmolLM2-135M), else replay (Qwen3.5-4B); off = resume from the last checkpoint (evaluation points, "
        "checkpointEverySteps), sampling the steps since again",
    )
    keep_checkpoints: KeepCheckpoints = Field(
        "lastAndBest",
        description="checkpoints kept in the store once the run succeeds: lastAndBest = the last one and the best "
        "(and final) evaluation's, the others deleted; all = every one (a few GB each for a real model)",
    )
    seed: Int64 = Field(
        42,
        description="seed of the RSFT prompt order and of each step's sampling and minibatch shuffles (the "
        "paper's launchers: 42, verl's data.seed)",
    )
    sampling: Sampling = Sampling()
    mini_batch_scope: Literal["perRank", "global"] = Field(
        "perRank",
        description="what miniBatchSize counts. perRank (the paper's verl): the kept trajectories are first shared "
        "out over the data-parallel ranks (train.numNodes x train.gpusPerNode), then each rank cuts its share into "
        "miniBatchSize sequences, so one optimiser update covers ranks x miniBatchSize sequences and a step makes "
        "sftEpochs x ceil(ceil(kept / ranks) / miniBatchSize) updates; global: miniBatchSize sequences per update "
        "over all ranks, sftEpochs x ceil(kept / miniBatchSize) updates (ranks times more at the same learning "
        "rate). `whale plan` prints the figure",
    )
    attention: Literal["auto", "sdpa", "flex", "flash", "varlen"] = Field(
        "auto",
        description="attention kernel of packed micro-batches (packSequences: true), where several trajectories "
        "share a row and none may attend to another: flex = flex attention with a block-sparse document mask "
        "(compiled with the layers on a GPU); varlen = torch's flash varlen kernel "
        "(torch.nn.attention.varlen, GPU) over the row's sequence offsets; sdpa = transformers' dense document "
        "mask (exact, but off the flash kernel); flash = flash-attn's varlen kernel (needs the flash-attn package "
        "in the worker image); auto = flex when packing. flex, varlen and flash need packSequences: true (padded "
        "micro-batches already run SDPA's flash kernel)",
    )
    async_checkpoint: StrictBool = Field(
        True,
        description="checkpoint without stopping training: the weights and optimiser state are copied to host "
        "memory (the trainer waits for that copy only) and written by a background thread while the next step "
        "samples; the checkpoint counts (COMPLETE marker) only once fully written, the same bytes as a "
        "synchronous write. Needs host memory for one copy of weights + optimiser state (about 12 bytes per "
        "parameter in fp32). false = write before the next step",
    )
    pack_tokens: Annotated[int, Strict(), Field(ge=128, le=1 << 20)] | None = Field(
        None,
        description="packed micro-batches (packSequences: true) by tokens instead of by sequences: each row is "
        "filled with up to this many tokens (longest first, first fit), so rows are nearly full and most land on "
        "one width (with compileLayers a row is padded to its bucket rung, at most packTokens); the number of "
        "sequences per micro-batch varies and microBatchSizePerGpu is not used for packed rows (the loss is the "
        "same token mean per minibatch). It bounds an ordinary row's activation memory: a sequence longer than "
        "packTokens gets a row of its own, as wide as it is; null = microBatchSizePerGpu sequences per row",
    )

    @model_validator(mode="after")
    def _batches(self) -> RSFT:
        if self.micro_batch_size_per_gpu > self.mini_batch_size:
            raise ValueError(
                f"microBatchSizePerGpu ({self.micro_batch_size_per_gpu}) must be <= miniBatchSize "
                f"({self.mini_batch_size})"
            )
        if self.attention in ("flex", "flash", "varlen") and not self.pack_sequences:
            raise ValueError(
                f"attention: {self.attention} is the kernel of packed micro-batches; set packSequences: true, or "
                "leave attention at auto (padded micro-batches run SDPA's flash kernel)"
            )
        if self.pack_tokens is not None and not self.pack_sequences:
            raise ValueError(
                "packTokens sizes packed micro-batches; set packSequences: true, or leave packTokens unset"
            )
        return self


class SecretKey(WireModel):
    """A key of a Kubernetes Secret in the run's namespace (the operator injects it by ``secretKeyRef``: the
    value never enters a manifest)."""

    name: K8sName = Field(..., description="the Secret (a Kubernetes object name)")
    key: Annotated[str, Strict(), Field(min_length=1, max_length=253, pattern=SECRET_KEY)] = Field(
        ..., description="the key inside the Secret"
    )


class SecretKeyRef(SecretKey):
    """A key of a Kubernetes Secret; locally the value is read from the environment variable ``env``."""

    env: EnvName | None = Field(
        None,
        description="environment variable holding the value (locally for `whale run`; on a cluster the "
        f"Secret is injected under it; default {PROPOSER_KEY_ENV}); loader, interpreter, shell, proxy, "
        "TLS and WHALE_ variables are refused",
    )


#: an absolute host path (a cli proposer's install, mounted read-only into its sandbox)
AbsolutePath = Annotated[str, Strict(), Field(min_length=2, max_length=4096, pattern=ABSOLUTE_PATH)]
#: a Kubernetes object UID (RFC 4122 text form, what metadata.uid holds)
ObjectUID = Annotated[
    str,
    Strict(),
    Field(min_length=36, max_length=36, pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"),
]
#: D_harness rollouts the proposer's run_candidate tool may spend per iteration (an option; the paper's proposer
#: runs no benchmarks)
MAX_TRIAL_ROLLOUTS = 100_000


class Proposer(WireModel):
    """The coding agent that writes harness candidates (docs/metaharness.md#the-proposer)."""

    backend: Literal["openai", "anthropic", "cli", "replay", "mutate"] = Field(
        "openai",
        description="openai: built-in agent loop over an OpenAI-compatible chat API with tool calls; "
        "anthropic: the same loop over the Anthropic Messages API; cli: an external agent command, run in the "
        "sandbox; replay: a recorded proposal script (tests/CI); mutate: blind search, no model - each candidate "
        "is the incoming harness with 1-2 declared knobs (prompts, turn limit, retries, integer budgets) changed at "
        "random, seeded by harnessSearch.seed (the baseline an LLM proposer must beat)",
    )
    model: Annotated[str, Strict(), Field(min_length=1, max_length=256)] | None = Field(
        None,
        description="openai/anthropic: the model to ask; cli: the {model} template field (the paper's claude-opus-4-7)",
    )
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="cli: the {effort} template field (Claude Code's --effort; the paper's max)"
    )
    base_url: Annotated[str, Strict(), Field(min_length=1, max_length=2048, pattern=URL)] | None = Field(
        None,
        description="openai: the OpenAI-compatible endpoint (.../v1); anthropic: the Messages API root "
        "(default https://api.anthropic.com)",
    )
    api_key_secret: SecretKeyRef | None = Field(
        None,
        description="the API key (openai, anthropic; cli: handed to the agent under `env`); required for "
        "openai/anthropic, except an openai baseUrl on loopback",
    )
    command: list[Annotated[str, Strict(), Field(max_length=65_536)]] | None = Field(
        None,
        max_length=256,
        description="cli backend: argv template; {scratch} {archive} {skill} {prompt} {n} "
        "{iteration} {max_turns} {timeout} {model} {effort}, and {skill_text} (the SKILL.md text, as the "
        "reference appends it to Claude Code's system prompt)",
    )
    read_paths: list[AbsolutePath] = Field(
        default_factory=list,
        max_length=32,
        description="cli backend: absolute host paths of the agent's own "
        "install, mounted read-only in its sandbox (the system runtime under /usr is always there)",
    )
    network: Literal["proxy", "host", "none"] = Field(
        "proxy",
        description="cli backend: proxy = its sandbox has loopback only and one way out, an HTTPS (CONNECT) proxy "
        "outside it that reaches only the names of allowHosts, at public addresses, and the run's tool services its "
        "prototyping kit lists (the agent's HTTPS_PROXY); "
        "host = its sandbox shares the host's network (it reaches all its launcher reaches: the run's vLLM, tool "
        "services, the store, cloud metadata; the paper's reference ran Claude Code so); none = no network",
    )
    allow_hosts: list[Annotated[str, Strict(), Field(min_length=1, max_length=259, pattern=egress.ENTRY_PATTERN)]] = (
        Field(
            default_factory=lambda: list(egress.DEFAULT_ALLOW_HOSTS),
            min_length=1,
            max_length=64,
            description="cli backend, network proxy: the host names the agent may reach, exact (no wildcard, no IP "
            "literal), each `name` (port 443) or `name:port`",
        )
    )
    allow_private_hosts: list[
        Annotated[str, Strict(), Field(min_length=1, max_length=254, pattern=egress.NAME_PATTERN)]
    ] = Field(
        default_factory=list,
        max_length=64,
        description="cli backend, network proxy: names of allowHosts that may resolve to loopback, link-local, "
        "private or cluster addresses (refused otherwise, so that a name never leads into the cluster or the "
        "host unless the spec says so); e.g. a model server inside the cluster",
    )
    script: Annotated[str, Strict(), Field(min_length=1, max_length=4096)] | None = Field(
        None, description="replay backend: path of the recorded proposal script"
    )
    timeout_seconds: Seconds = Field(2400, description="per iteration: wall time of the proposer's session")
    max_turns: Annotated[int, Strict(), Field(ge=1, le=10_000)] = Field(
        40,
        description="openai/anthropic: model calls per iteration (cli: only the {max_turns} template field; the "
        "paper's Claude Code session has no turn cap)",
    )
    max_tokens: Annotated[int, Strict(), Field(ge=1, le=MAX_PROPOSER_TOKENS)] = Field(
        200_000,
        description="openai/anthropic: per iteration, tokens the model generated plus tokens it read for the "
        "first time (not the same context re-counted per call); a cli agent's usage is recorded, not capped",
    )
    max_reply_tokens: Tokens = Field(8192, description="openai/anthropic: the longest reply of one model call")
    run_candidate_rollouts: Annotated[int, Strict(), Field(ge=0, le=MAX_TRIAL_ROLLOUTS)] = Field(
        0,
        description="openai/anthropic: D_harness rollouts the run_candidate tool may spend per iteration "
        "(counted in the phase's rollouts and in `whale plan`; at most 16 per call); 0, the default, offers no "
        "such tool: the paper's proposer does not run benchmarks, the outer loop evaluates",
    )
    shell: StrictBool = Field(
        True, description="openai/anthropic: offer the sandboxed run_shell tool over the read-only archive copy"
    )

    @model_validator(mode="after")
    def _backend_fields(self) -> Proposer:
        if self.backend == "cli" and not self.command:
            raise ValueError("backend 'cli' needs `command` (the agent CLI's argv)")
        if self.backend == "cli":
            used = " ".join(self.command or [])
            for name, value in (("model", self.model), ("effort", self.effort)):
                if "{" + name + "}" in used and value is None:
                    raise ValueError(f"the cli command uses {{{name}}}: set `{name}`")
        if self.backend == "replay" and not self.script:
            raise ValueError("backend 'replay' needs `script`")
        try:
            egress.EgressPolicy(tuple(self.allow_hosts), tuple(self.allow_private_hosts))
        except ValueError as exc:
            raise ValueError(f"allowHosts/allowPrivateHosts: {exc}") from None
        return self


#: the refusals of the two settings that lift a wall, until the spec says it means it (the CRD's CEL rules say
#: the same)
INTEGRITY_OFF_UNACKNOWLEDGED = (
    "harnessSearch.integrity.action: off lifts the reward-integrity walls (answers the model did not write keep "
    "their reward, no candidate or evaluation is flagged); set harnessSearch.integrity.acknowledgeOff: true to "
    "confirm, or use action flag"
)
UNISOLATED_UNACKNOWLEDGED = (
    "sandbox.isolation: none runs harness files and model-written code WITHOUT isolation (they can read what "
    "the run can: its files, the data, the checkout, its credentials); set sandbox.acknowledgeUnisolated: true "
    "to confirm (trusted local use only), or use namespaces"
)


class RewardIntegrity(WireModel):
    """Reward-integrity checks of the harness search: a candidate whose reward does not come through the
    model (rewarded episodes with no model call; a better score while the model's completion tokens per
    episode fall below ``minTokenRatio`` x the incoming harness's) is flagged, and refused unless
    ``action`` says otherwise. docs/metaharness.md explains the rules and the default."""

    action: Literal["reject", "flag", "off"] = Field(
        "reject",
        description="reject: flagged candidates are never accepted; flag: accepted by score but flagged in "
        "the phase result and the status; off: no checks (model usage is still recorded)",
    )
    min_token_ratio: Annotated[float, Strict(), Field(ge=0, le=1)] = Field(
        0.25,
        description="flag a candidate that beats the incoming harness's score with fewer completion "
        "tokens per episode than this fraction of the incoming's (0 disables this rule)",
    )
    acknowledge_off: StrictBool = Field(
        False,
        description="required with action off: true says the spec's author accepts reward that does not come "
        "through the model (answers the model did not write keep their reward, nothing is flagged)",
    )

    @model_validator(mode="after")
    def _acknowledged(self) -> RewardIntegrity:
        if self.action == "off" and not self.acknowledge_off:
            raise ValueError(INTEGRITY_OFF_UNACKNOWLEDGED)
        return self


class HarnessSearch(WireModel):
    proposals_per_iteration: Annotated[int, Strict(), Field(ge=1, le=100)] = Field(
        3, description="candidate harnesses the proposer writes per iteration"
    )
    rollouts_per_item: Samples = Field(1, description="rollouts per D_harness item when scoring a candidate")
    prompt_only: StrictBool = Field(False, description="FST baseline: only the two prompt constants may change")
    smoke_test_items: Items = Field(4, description="D_harness items a candidate must survive before full scoring")
    candidate_timeout_seconds: Seconds = Field(3600, description="wall time to score one candidate")
    proposer: Proposer = Proposer()
    integrity: RewardIntegrity = Field(
        RewardIntegrity(), description="flag/refuse candidates that score without the model"
    )
    seed: Int64 | None = Field(
        0,
        description="sampling seed of candidate scoring, smoke tests and run_candidate trials (each model call's "
        "seed from (seed, item id, sample, turn), so every candidate meets the same draws) and of the mutate "
        "proposer's draws. null: unseeded",
    )


class Evaluation(WireModel):
    """Test mean@k at regular points of the weight budget, after every harness phase and at the end."""

    samples_per_item: Samples = Field(8, description="k of mean@k")
    temperature: Temperature = 1.0
    interval_epochs: Epochs | None = Field(
        None,
        description=f"evaluate every this many epochs (default 0.1; at most {MAX_EVALUATION_POINTS} "
        "points over the weight budget)",
    )
    interval_steps: Steps | None = Field(None, description="the interval in steps")
    at_start: StrictBool = Field(True, description="also evaluate (theta0, h0) before anything trains")
    after_harness_phase: StrictBool = Field(True, description="evaluate the accepted harness after every harness phase")
    every_accepted_harness: StrictBool = Field(
        True,
        description="mh_only: evaluate every harness its search accepts - each iteration whose accepted "
        "(best-so-far) harness changes - not only the start and the end, so that its best over evaluation points "
        "is measured like the other conditions'. One mean@k pass per change: at most mhOnlyIterations of them "
        "(`whale plan` lists the bound); false: the start and the accepted harness at the end only",
    )
    max_items: Items | None = Field(None, description="cap the test items (smoke runs)")
    split: Literal["test", "harness", "weight"] = "test"
    timeout_seconds: Seconds = Field(
        86400,
        description="wall time of one evaluation; past it every episode not yet done ends failed (reward 0, "
        "end: limit) and the result says how many",
    )
    seed: Int64 | None = Field(
        0,
        description="sampling seed of every evaluation: each model call's seed is derived from (seed, item id, "
        "sample index, turn), so the same checkpoint and harness give the same mean@k whatever the concurrency or "
        "batching (sent as the request's `seed` to an OpenAI-compatible server, which vLLM honours; reproducible "
        "up to the server's floating-point nondeterminism). null: unseeded sampling",
    )

    @model_validator(mode="after")
    def _one_unit(self) -> Evaluation:
        if self.interval_epochs is not None and self.interval_steps is not None:
            raise ValueError("give intervalEpochs or intervalSteps, not both")
        return self


class Model(WireModel):
    name: Annotated[str, Strict(), Field(min_length=1, max_length=4096)] = Field(
        ..., description="HF model id, or a local path / store URI of a checkpoint"
    )
    revision: str | None = Field(None, description="HF revision (branch, tag or commit)")
    served_model_name: str | None = Field(None, description="the name vLLM serves the model under")
    max_model_len: Tokens = Field(32768, description="vLLM --max-model-len")
    trust_remote_code: StrictBool = False
    gguf_file: Annotated[str, Strict(), Field(min_length=1, max_length=1024, pattern=RELATIVE_PATH)] | None = Field(
        None, description="load from this GGUF file inside `name` (CPU demo models): a relative path without '..'"
    )
    hf_token_secret: SecretKey | None = Field(
        None,
        description="cluster: the Secret key holding a Hugging Face token, for a gated or private `name` (its weights "
        "and tokenizer); injected by secretKeyRef as HF_TOKEN into the containers that download them (the inference "
        "pod's fetch-weights and weight-sync, the colocated fetch-weights, the weight Job, the retriever's "
        "fetch-tokenizer), never into a harness, tool service, sandbox or proposer. Locally: HF_TOKEN in the "
        "environment of `whale run`",
    )
    enable_thinking: StrictBool = Field(
        True,
        description="the chat template's enable_thinking: sent as chat_template_kwargs on every request "
        "(training rollouts, evaluation, harness search) and used when RSFT re-renders a trajectory; the model's "
        "thinking stays in the reply's content and carries loss like any generated token (the paper: true)",
    )


class DataSourcePin(WireModel):
    """Where one named source of the full data comes from, overriding the domain's default: a mirror
    (``url``) and/or the digest the download must have (``sha256``). ``whale prepare`` lists a
    domain's source names."""

    name: Annotated[str, Strict(), Field(min_length=1, max_length=64, pattern=DNS1123_LABEL)] = Field(
        ..., description="the source, e.g. lichess-puzzles, dapo-math-17k, nq-train"
    )
    url: Annotated[str, Strict(), Field(min_length=8, max_length=2048, pattern=SOURCE_URL)] | None = Field(
        None, description="download it from here instead (a mirror); http or https"
    )
    sha256: Annotated[str, Strict(), Field(min_length=64, max_length=64, pattern=SHA256_HEX)] | None = Field(
        None,
        description="refuse a download whose SHA-256 differs (the Lichess file changes monthly: pin the one you mean)",
    )


class Data(WireModel):
    """Where the domain's raw files are, and optional caps on the split sizes."""

    source: Literal["sample", "full"] = Field(
        "sample",
        description="sample: the small files under dataDir (default: the sample data shipped with whale), what `whale run` and CI use; "
        "full: the paper's datasets, fetched, checksummed and split by the prepare phase (`whale prepare` locally, "
        "the prepare Job on a cluster) into the run's store, with the paper's split sizes (docs/data.md)",
    )
    sources: list[DataSourcePin] = Field(
        default_factory=list,
        max_length=32,
        description="source: full only: mirrors and pinned digests of named sources",
    )
    data_dir: str | None = Field(
        None,
        max_length=4096,
        description="raw data root (default: $WHALE_DATA_DIR, else the sample data shipped in the package, whale/data/sample)",
    )
    seed: Int64 = Field(
        42,
        description="seed of the split draws: D_harness, D_weight order, sampled test items (the "
        "paper's reference code: 42)",
    )
    weight_size: Items | None = Field(None, description="cap |D_weight|")
    harness_size: Items = Field(256, description="|D_harness|")
    test_size: Items | None = Field(
        None, description="|D_test| (per benchmark where the domain has several); unset: the domain's default"
    )

    @model_validator(mode="after")
    def _sources(self) -> Data:
        names = [pin.name for pin in self.sources]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"sources: {dup!r} is listed twice; give each source once")
        if self.sources and self.source != "full":
            raise ValueError("sources: only the full data is fetched; set source: full or remove sources")
        return self


class Storage(WireModel):
    uri: Annotated[str, Strict(), Field(max_length=2048, pattern=URL)] | None = Field(
        None, description="file:///path or s3://bucket/prefix; `whale run --store` overrides it"
    )
    endpoint: Annotated[str, Strict(), Field(max_length=1024, pattern=ENDPOINT)] | None = Field(
        None, description="S3 endpoint host:port (MinIO)"
    )
    secure: StrictBool = Field(False, description="HTTPS to the S3 endpoint")
    region: str | None = None
    credentials_secret: K8sName | None = Field(
        None, description="Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (cluster)"
    )


class Inference(WireModel):
    """How rollouts are sampled: a vLLM server (cluster) or the in-process transformers backend (CPU)."""

    backend: Literal["auto", "vllm", "transformers", "openai"] = Field(
        "auto", description="auto: vllm on a cluster, transformers in `whale run`"
    )
    base_url: Annotated[str, Strict(), Field(max_length=2048, pattern=URL)] | None = Field(
        None, description="openai backend: an existing OpenAI-compatible endpoint"
    )
    max_concurrency: Annotated[int, Strict(), Field(ge=1, le=100_000)] = Field(
        64, description="episodes in flight against the server"
    )
    request_timeout_seconds: Seconds = 600
    tensor_parallel_size: Annotated[int, Strict(), Field(ge=1, le=1_024)] = Field(
        1, description="vLLM --tensor-parallel-size"
    )
    gpu_memory_utilization: Fraction = 0.9
    tool_call_parser: str | None = Field("qwen3_coder", description="vLLM --tool-call-parser")
    extra_args: list[str] = Field(default_factory=list, max_length=256, description="more `vllm serve` arguments")
    reasoning_parser: str | None = Field(
        None,
        max_length=64,
        description="vLLM --reasoning-parser (e.g. qwen3), passed when model.enableThinking is true: the "
        "server then moves the thinking out of content into reasoning_content, so harnesses and verifiers see only "
        "the answer. null (the paper's setting): the thinking stays inline in content, as the in-process backend "
        "gives it",
    )
    placement: Literal["separate", "colocated"] = Field(
        "separate",
        description="vllm: separate (the paper's launchers): the server on GPUs of its own, idle while "
        "the trainer works; colocated: one train pod, the server a second container on the trainer's GPUs, put to "
        "sleep during each SFT update and woken before generation (verl's hybrid engine). The in-process "
        "transformers backend is always colocated",
    )
    colocated_gpu_memory_utilization: Annotated[float, Strict(), Field(gt=0, le=0.9)] = Field(
        0.35,
        description="colocated: vLLM --gpu-memory-utilization, its share of each trainer GPU while awake (the "
        "trainer's weights and optimiser state stay on the GPU: leave them the rest)",
    )
    sleep_level: Annotated[int, Strict(), Field(ge=0, le=2)] = Field(
        1,
        description="colocated: vLLM /sleep level during SFT: 1 offloads the weights to host memory and drops the "
        "KV cache; 2 drops both (the weight sync after SFT reloads the weights anyway); 0 never sleeps (verl's "
        "free_cache_engine false): the server keeps its colocatedGpuMemoryUtilization share through SFT, so the "
        "trainer must fit in the rest, and no step pays a sleep and a wake",
    )

    weight_sync: Literal["auto", "cudaIpc"] = Field(
        "auto",
        description="how each RSFT step's weights reach the vLLM server. auto: through the object store and the "
        "server pod's weight-sync sidecar (separate), or a folder shared in the pod (colocated): the trainer writes "
        "a bf16 checkpoint and the server reloads it. cudaIpc (colocated only, tensorParallelSize 1): the trainer "
        "hands the server CUDA IPC handles of bf16 copies of its weights, on the GPU they share, through vLLM's "
        "weight-transfer API (the server runs with --weight-transfer-config backend ipc and "
        "VLLM_ALLOW_INSECURE_SERIALIZATION=1: it unpickles the handles); nothing is written or read. A speed-only "
        "setting: the same weights reach the server",
    )

    @model_validator(mode="after")
    def _placement_fields(self) -> Inference:
        if self.placement == "colocated" and self.backend not in ("auto", "vllm"):
            raise ValueError(
                f"placement colocated puts a vLLM server on the trainer's GPUs; backend {self.backend!r} "
                "has none: set backend vllm (or auto), or placement separate"
            )
        if self.weight_sync == "cudaIpc":
            if self.placement != "colocated":
                raise ValueError(
                    "weightSync cudaIpc hands the server handles to GPU memory, so the trainer and the server must "
                    "share the GPU: set placement colocated, or weightSync auto"
                )
            if self.tensor_parallel_size != 1:
                raise ValueError(
                    f"weightSync cudaIpc sends the weights from the trainer's one GPU; tensorParallelSize is "
                    f"{self.tensor_parallel_size}, so the server's other GPUs would get none: set "
                    "tensorParallelSize 1, or weightSync auto"
                )
        return self


#: evictions of one phase attempt the run tolerates under a queue (``execution.retry.maxEvictions``): not the
#: paper's (it ran on dedicated GPUs), a cluster setting
DEFAULT_MAX_EVICTIONS = 10


class Retry(WireModel):
    max_attempts: Annotated[int, Strict(), Field(ge=1, le=100)] = Field(
        3, description="attempts per phase before the run fails"
    )
    active_deadline_seconds: Annotated[int, Strict(), Field(ge=1, le=MAX_DEADLINE_S)] | None = Field(
        None, description="wall time of one attempt's Job (cluster)"
    )
    stall_after_seconds: Annotated[int, Strict(), Field(ge=60, le=MAX_DEADLINE_S)] | None = Field(
        3600,
        description="the Stalled condition turns True when a phase's child runs and the store showed no "
        "progress (a metrics line, a result, a checkpoint) for this long; it only alerts, nothing is stopped. "
        "null: never",
    )
    max_evictions: Annotated[int, Strict(), Field(ge=0, le=1000)] = Field(
        DEFAULT_MAX_EVICTIONS,
        description="cluster, under a queue (default 10): how many times Kueue may evict one attempt of a phase (preemption, a "
        "waitForPodsReady timeout, a stopped queue) and re-admit the same Job; one eviction more fails the run "
        "(reason EvictionLimitReached). Kueue's own requeuing back-off spaces the re-admissions (docs/operator.md)",
    )


# ----- the train Job's shape (execution.train: read on a cluster, ignored by `whale run`) ---------------


class Resources(WireModel):
    requests: dict[QualifiedName, Quantity] = Field(
        default_factory=dict, max_length=32, description="e.g. cpu: '8', memory: 32Gi, nvidia.com/gpu: '1'"
    )
    limits: dict[QualifiedName, Quantity] = Field(default_factory=dict, max_length=32)


class Train(WireModel):
    """Train Job shape. numNodes > 1 makes the train Job an Indexed Job with torchrun rendezvous."""

    num_nodes: Annotated[int, Strict(), Field(ge=1, le=1_024)] = 1
    gpus_per_node: Annotated[int, Strict(), Field(ge=0, le=64)] = 1
    deepspeed_config: str | None = Field(None, description="DeepSpeed config path in the worker image")
    resources: Resources = Resources()


class Tracking(WireModel):
    """Also log the run's metrics to TensorBoard / Weights & Biases / MLflow (like TRL's ``report_to``).

    Off by default; the store keeps every metric either way. Each workload logs its phase when the phase
    ends (docs/report.md); ``whale report --export`` replays a whole run from the store."""

    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        max_length=3,
        description="tracking backends (the package extras tensorboard|wandb|mlflow; `make install` has all three)",
    )
    project: str | None = Field(None, max_length=128, description="W&B project / MLflow experiment (default: whale)")
    tensorboard_dir: str = Field(
        ".whale/tensorboard",
        max_length=4096,
        description="event files go to {tensorboardDir}/{run name}; relative to the working directory "
        "of `whale run` (on a cluster: a path on a mounted volume)",
    )


#: why ``harnessSearch.proposer.backend: cli`` and ``sandbox.isolation: pod`` do not go together (the spec's check
#: and its CEL rule in whale_operator.crd say the same)
CLI_AT_POD = (
    "experiment.harnessSearch.proposer.backend: cli cannot run at execution.sandbox.isolation pod: its agent CLI "
    "must reach its "
    "model's API, and at pod the harness search's pod starts no sandbox (its untrusted code runs in the harness "
    "pod, which has no egress); use a built-in agent backend (openai or anthropic), or execution.sandbox.isolation "
    "namespaces"
)


#: why ``proposer.network: proxy`` and ``sandbox.isolation: none`` do not go together (the spec's check and its CEL
#: rule in whale.crd say the same)
PROXY_UNISOLATED = (
    "experiment.harnessSearch.proposer.network: proxy needs execution.sandbox.isolation namespaces (the agent's own "
    "network namespace is the wall the proxy guards; at none the agent has the host's network): set "
    "experiment.harnessSearch.proposer.network: host to say so, or use isolation namespaces"
)


class EpisodeBounds(WireModel):
    """What one episode may take, whatever its harness does (docs/security.md, "Bounds"): on reaching a bound
    the episode ends failed (``end: limit``, reward 0, the reason in its trace). Not the paper's (it has
    none): generous enough that no harness of the paper's kind meets them."""

    max_actions: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] = Field(
        256, description="environment steps and tool calls of one episode"
    )
    max_message_bytes: Annotated[int, Strict(), Field(ge=1024, le=1 << 30)] = Field(
        256 << 10, description="UTF-8 bytes of one message a harness hook adds, or of one action"
    )
    max_episode_bytes: Annotated[int, Strict(), Field(ge=1024, le=1 << 34)] = Field(
        4 << 20, description="UTF-8 bytes of all the messages of one episode (the model's replies included)"
    )
    timeout_seconds: Seconds = Field(1800, description="wall time of one episode (hooks, model calls, tools)")


class Sandbox(WireModel):
    """How untrusted code runs: proposer-written harness files and the model's code (math's code tool)."""

    episode: EpisodeBounds = Field(EpisodeBounds(), description="what one episode may take (actions, bytes, time)")
    acknowledge_unisolated: StrictBool = Field(
        False,
        description="required with isolation none: true says the spec's author accepts untrusted code running "
        "without isolation (trusted local use only)",
    )

    @model_validator(mode="after")
    def _acknowledged(self) -> Sandbox:
        if self.isolation == "none" and not self.acknowledge_unisolated:
            raise ValueError(UNISOLATED_UNACKNOWLEDGED)
        return self

    isolation: Literal["namespaces", "pod", "none"] = Field(
        "namespaces",
        description="namespaces: kernel isolation (own network and mount namespaces, a fresh unprivileged uid, "
        "only the standard library and the harness visible); a phase fails when the host cannot provide it. "
        "pod (cluster only; `whale run` refuses it): the run's harness pod and the code tool's pod are the wall "
        "(no credentials, no service-account token, no egress, restricted securityContext, optionally "
        "placement.harness.runtimeClassName), processes there keep rlimits, a fresh scratch directory and the "
        "allow-listed environment but no kernel namespaces, so every pod is restricted. On a cluster namespaces "
        "needs privileged sandbox hosts, which the operator renders only in namespaces its admin lists "
        "(sandboxHosts.namespaces); elsewhere the run runs at pod (docs/operator.md#pod-security). "
        "none: NO isolation - harness processes and the code tool run as the workload's user and can read "
        "what it can (its files, the data, the checkout); for trusted local use only",
    )


class Judge(WireModel):
    """An LLM judge (the reference's llm_judge.py settings), used where a domain's options score with one
    (search_qa's ``domainOptions.searchAnswer: llmJudge``)."""

    model: Annotated[str, Strict(), Field(min_length=1, max_length=256)] = Field(
        "gpt-5.4-mini", description="the judge model (the reference's docs/data.md: gpt-5.4-mini)"
    )
    base_url: Annotated[str, Strict(), Field(min_length=1, max_length=2048, pattern=URL)] = Field(
        "https://api.openai.com/v1", description="an OpenAI-compatible chat endpoint (.../v1)"
    )
    api_key_env: EnvName | None = Field(
        "OPENAI_API_KEY",
        description="environment variable holding the judge's API key where episodes are scored (`whale run`'s "
        "environment; on a cluster the operator injects apiKeySecret under it); null: no key (a local endpoint)",
    )
    api_key_secret: SecretKey | None = Field(
        None,
        description="cluster: the Secret key holding the judge's API key, injected under apiKeyEnv into the "
        "pods that score episodes (the eval, weight and harness-search Jobs; never the harness host, the tools, "
        "the prepare Job or a cli proposer's sandbox); required there when the run scores with the judge and apiKeyEnv is set",
    )

    @model_validator(mode="after")
    def _secret_needs_env(self) -> Judge:
        if self.api_key_secret is not None and self.api_key_env is None:
            raise ValueError(
                "apiKeySecret is injected under apiKeyEnv: name the variable (apiKeyEnv), or drop apiKeySecret "
                "for an endpoint without a key"
            )
        return self


class Verifier(WireModel):
    """Scoring services a domain may use (a domain's own scoring rules are its ``domainOptions``)."""

    judge: Judge = Field(
        Judge(),
        description="an LLM judge, for a domain whose options score with one (search_qa's searchAnswer: llmJudge)",
    )


# ----- the spec -----------------------------------------------------------------------------------


#: the parts of the experiment a run's one ``seed`` reaches: (wire name, Python name) of each with a ``seed`` field
SEEDED_PARTS = (("data", "data"), ("rsft", "rsft"), ("evaluation", "evaluation"), ("harnessSearch", "harness_search"))


def spread_seed(data: Any) -> Any:
    """An experiment's raw fields with ``seed`` copied into each seeded part that leaves its own unset (pure; a
    non-mapping, or one without ``seed``, comes back as it is, for the field validators to judge)."""
    if not isinstance(data, dict) or data.get("seed") is None:
        return data
    seed = data["seed"]
    out = dict(data)
    for wire, py in SEEDED_PARTS:
        key = py if py in out and wire not in out else wire
        part = out.get(key)
        if part is None:
            out[key] = {"seed": seed}
        elif isinstance(part, dict) and "seed" not in part:
            out[key] = {**part, "seed": seed}
        # a part given as a model instance (or a bad value) is left to validation as it is
    return out


class Experiment(WireModel):
    """What the run computes. Its phases, checkpoints and split sizes are made from it, so once a run has a phase
    it may not change (whale.core.mutability): another experiment is another run."""

    model: Model = Field(..., description="the base model theta0")
    schedule: Schedule = Field(Schedule(), description="budgets: weight steps, E, I, patience")
    rsft: RSFT = Field(RSFT(), description="the weight phase")
    harness_search: HarnessSearch = Field(HarnessSearch(), description="the harness phase")
    evaluation: Evaluation = Field(Evaluation(), description="test mean@k")
    data: Data = Field(Data(), description="the domain's raw data and split sizes")
    verifier: Verifier = Field(Verifier(), description="scoring services a domain may use (an LLM judge)")
    domain_options: dict[Annotated[str, Field(max_length=64)], Any] = Field(
        default_factory=dict,
        max_length=64,
        description="the domain's own options (its problem set, corpus or scoring rule), validated by the domain "
        "(domains/<domain>/options.py; docs/reference.md#domain-options lists them)",
    )
    seed: Int64 | None = Field(
        None,
        description="one seed for every random choice of the run: each of data.seed, rsft.seed, evaluation.seed and "
        "harnessSearch.seed that the manifest leaves unset takes this value (a part that sets its own keeps it). "
        "Unset: each part's own default (the paper's 42 for data and RSFT, 0 for evaluation and harness search)",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_seed(cls, data: Any) -> Any:
        """``seed`` fills the seed of every part that does not set its own (docs/reproducing.md#seeds)."""
        return spread_seed(data)


class Execution(WireModel):
    """How the run is carried out: free to change between two runners of one run, or mid-run on a cluster (a
    resumed run picks the new values up)."""

    storage: Storage = Field(Storage(), description="the object store every phase writes to")
    inference: Inference = Field(Inference(), description="how rollouts are sampled")
    retry: Retry = Field(Retry(), description="failure handling per phase")
    train: Train = Field(Train(), description="train Job shape (cluster)")
    sandbox: Sandbox = Field(Sandbox(), description="isolation of untrusted code (harness files, model-written code)")
    suspend: StrictBool = Field(False, description="true: stop every child cleanly; false again resumes")
    tracking: Tracking = Field(Tracking(), description="metrics also to TensorBoard / W&B / MLflow (off by default)")
    resume_from: ObjectUID | None = Field(
        None,
        description="cluster: adopt the store of an earlier WhaleRun of this name in this namespace (the UID "
        "in its status.storeUri) instead of starting clean; a run's store is "
        "<execution.storage.uri>/<namespace>/<name>.<uid>. `whale run` ignores it (a local store is keyed by the run name)",
    )


class WhaleRunSpec(WireModel):
    """A run by owner: ``domain`` and ``condition``, the ``experiment`` (what it computes), the ``execution`` (how it
    is carried out) and the ``cluster`` (where its pods go: the operator's; `whale run` keeps it as written)."""

    domain: str = Field(..., description="a registered domain (entry-point group whale.domains)")
    condition: Condition = Field(..., description="rsft_only | mh_only | whale | adaptive_whale")
    experiment: Experiment = Field(..., description="what the run computes: fixed once the run has a phase")
    execution: Execution = Field(Execution(), description="how the run is carried out: may change on resume")
    # opaque here: kept, compared and hashed with the rest, never read; the operator types it (whale_operator.cluster_spec)
    cluster: dict[Annotated[str, Field(max_length=64)], Any] = Field(
        default_factory=dict,
        max_length=64,
        description="Kubernetes placement, read by the operator (`whale run` ignores it)",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_v1alpha1(cls, data: Any) -> Any:
        """A spec of the previous API version (flat: ``rsft``, ``storage``... at the top) as this one, by the one
        conversion (whale.core.convert), so a spec written by an older WHALE (a store's spec.json) still reads; a
        field v1alpha2 moved since (``cluster.maxEvictions``) is read where it now lives."""
        return move_fields(convert_v1alpha1_spec(data) if is_v1alpha1_spec(data) else data)

    def with_sections(self, **sections: Any) -> Self:
        """This spec with some sections replaced, each by its field name (``rsft=...``, ``storage=...``),
        wherever it lives (experiment or execution); ``domain``, ``condition`` and ``cluster`` stay top-level."""
        top: dict[str, Any] = {k: sections.pop(k) for k in ("domain", "condition", "cluster") if k in sections}
        exp = {k: v for k, v in sections.items() if k in Experiment.model_fields}
        exe = {k: v for k, v in sections.items() if k in Execution.model_fields}
        unknown = set(sections) - set(exp) - set(exe)
        if unknown:
            raise ValueError(f"not a spec section: {', '.join(sorted(unknown))}")
        if exp:
            top["experiment"] = self.experiment.model_copy(update=exp)
        if exe:
            top["execution"] = self.execution.model_copy(update=exe)
        return self.model_copy(update=top)

    @model_validator(mode="after")
    def _proposer_isolation(self) -> WhaleRunSpec:
        if (
            self.condition.searches_harness
            and self.execution.sandbox.isolation == "pod"
            and self.experiment.harness_search.proposer.backend == "cli"
        ):
            raise ValueError(CLI_AT_POD)
        if (
            self.condition.searches_harness
            and self.execution.sandbox.isolation == "none"
            and self.experiment.harness_search.proposer.backend == "cli"
            and self.experiment.harness_search.proposer.network == "proxy"
        ):
            raise ValueError(PROXY_UNISOLATED)
        return self

    @model_validator(mode="after")
    def _condition_fields(self) -> WhaleRunSpec:
        sched = self.experiment.schedule
        has_budget = sched.total_epochs is not None or sched.total_steps is not None
        has_cycle = sched.weight_epochs_per_cycle is not None or sched.weight_steps_per_cycle is not None
        if self.condition.trains_weights and not has_budget:
            raise ValueError(
                f"experiment.schedule: condition {self.condition.value} trains weights and needs a weight budget: "
                "set experiment.schedule.totalEpochs or experiment.schedule.totalSteps"
            )
        if self.condition is Condition.MH_ONLY and (has_budget or has_cycle):
            raise ValueError(
                "experiment.schedule: mh_only never trains weights, so totalEpochs/totalSteps/weightEpochsPerCycle/"
                "weightStepsPerCycle can never apply; remove them (mhOnlyIterations sets its length)"
            )
        if self.condition is Condition.WHALE and not has_cycle:
            raise ValueError(
                "experiment.schedule: condition whale needs E: set experiment.schedule.weightEpochsPerCycle or "
                "experiment.schedule.weightStepsPerCycle"
            )
        if self.condition in (Condition.RSFT_ONLY, Condition.ADAPTIVE_WHALE) and has_cycle:
            raise ValueError(
                f"experiment.schedule: weightEpochsPerCycle/weightStepsPerCycle never apply to {self.condition.value} "
                "(rsft_only trains the whole budget in one phase; adaptive_whale ends phases by patience); "
                "remove them"
            )
        return self
