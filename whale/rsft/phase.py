"""The RSFT loop of one weight phase: from the start step up to the target step, resumable.

Each global step ``s`` (0-based; the metrics line says ``step = s + 1``, the number of steps done):

1. the prompts of ``PromptOrder.indices(s)``;
2. ``rolloutsPerPrompt`` rollouts each through the sampler (current weights, current harness);
3. keep reward > ``scoreThreshold``; none kept = no SFT (the weights stay exactly as they were): a
   warning in the log, ``kept: 0`` in the metrics line, the step in the result's ``emptySteps`` and the
   run's status (``emptySteps``, ``lastEmptyStep``);
4. SFT on the kept trajectories (``SFTTrainer``);
5. weight sync, so step ``s + 1`` samples from the new weights;
6. one metrics line; a checkpoint at saveSteps / every N steps / the end, then the resume state
   (:class:`whale.rsft.checkpoint_writer.CheckpointWriter`: with ``rsft.asyncCheckpoint`` a host
   snapshot written in the background while the next step samples; the result waits for it).

So that an interrupted phase goes on at the step after its last one (``rsft.stepResume``, :class:`StepResume`),
each step leaves a light resume point (a checkpoint with the optimiser) or, for a model too large to write one
every step, a replay record (its kept sequences, before its metrics line): a resumed attempt loads the last
checkpoint and trains the recorded steps since again, with their own learning rates and seeds, sampling none
of them again, so it reaches the weights the killed attempt had.

``progress`` (optional) hears where the step is (``PhaseProgress``: sampling, then training with the
reward of the rollouts just sampled, syncing, checkpointing), so a display shows a step's reward as soon
as its sampling ends, not after its SFT update and metrics line.

Between steps the loop checks the STOP object (-> ``stopped_by="stop-request"``) and the adaptive
patience rule on this phase's training rewards (-> ``"patience"``); either way the phase ends with
a checkpoint of the current step and a result. The sampler, trainer and sync are injected, so the
loop is tested with real components or named doubles alike.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from pydantic import ValidationError

from whale.core import layout
from whale.core.adaptive import weight_should_stop
from whale.core.protocol import (
    PhaseProgress,
    ProgressStage,
    StopReason,
    WeightPhaseArgs,
    WeightPhaseResult,
    WeightStepMetrics,
)
from whale.rsft import checkpoint as ckpt
from whale.rsft.checkpoint_writer import CheckpointWriter
from whale.rsft.collate import Example, encode_trajectories, stop_token_ids
from whale.rsft.config import RSFTConfig, lr_at, should_checkpoint
from whale.rsft.heap import freeze_long_lived
from whale.rsft.order import PromptOrder
from whale.rsft.rejection import Trajectory, select
from whale.rsft.sync import WeightSync
from whale.rsft.trainer import SFTTrainer
from whale.store.base import Store

if TYPE_CHECKING:
    from whale.rsft.dist import LeaderTrainer

log = logging.getLogger(__name__)


class WeightPhaseError(RuntimeError):
    """The phase cannot go on; the message says why and what to fix."""


class Sampler(Protocol):
    def sample(
        self, items: Sequence[dict[str, Any]], prompt_indices: Sequence[int], rollouts: int, seed: int
    ) -> list[Trajectory]:
        """``rollouts`` finished episodes per item, as trajectories (``prompt_index`` from ``prompt_indices``)."""


@dataclass(frozen=True)
class StartPoint:
    """Where a (possibly restarted) phase begins."""

    #: global steps already done
    step: int
    #: store prefix of the checkpoint to load (None: the base model of the spec)
    model_prefix: str | None
    optimizer_state: dict[str, Any] | None
    #: True when this phase's own resume state was found (an earlier attempt was killed)
    resumed: bool


def find_start(store: Store, run: str, phase: str, args: WeightPhaseArgs) -> StartPoint:
    """This phase's newest resume state, else the request's start (plus any carried optimiser state)."""
    if args.target_step < args.from_step:
        raise WeightPhaseError(
            f"phase {phase}: targetStep ({args.target_step}) is before fromStep ({args.from_step}); "
            "the controller must ask for a target at or after the start"
        )
    state = ckpt.load_state(store, run, phase)
    if state is not None:
        step, meta, optimizer = state
        if args.from_step <= step <= args.target_step:
            log.info("resuming phase %s at step %d (cursor %s)", phase, step, meta.get("cursor"))
            return StartPoint(step, layout.checkpoint_prefix(run, step), optimizer, True)
        log.warning("ignoring resume state at step %d: outside this request's steps", step)
    carried = ckpt.find_carried_optimizer(store, run, args.from_step, exclude_phase=phase) if args.from_step else None
    return StartPoint(args.from_step, args.from_checkpoint, carried, False)


def step_lines(raw: Sequence[dict[str, Any]]) -> list[WeightStepMetrics]:
    """The phase's metrics lines as their protocol model; a line that does not parse (written by an older
    version, or cut short) counts as no step, as the controllers' observer treats it. Pure."""
    lines = []
    for line in raw:
        try:
            lines.append(WeightStepMetrics.model_validate(line))
        except ValidationError:
            log.warning("skipping a metrics line that is no weight step: %.200s", line)
    return lines


def empty_steps(lines: Sequence[WeightStepMetrics]) -> list[int]:
    """The steps of these metrics lines that kept no trajectory (SFT skipped). Pure."""
    return sorted(line.step for line in lines if line.kept == 0)


def finish(
    store: Store, run: str, phase: str, step: int, stopped_by: StopReason, sandbox_isolation: str | None = None
) -> WeightPhaseResult:
    """Write the result (last): the checkpoint at ``step`` must already be complete.
    ``sandbox_isolation``: what the rollouts' harness process ran under (None: no rollouts this attempt)."""
    lines = step_lines(store.read_jsonl(layout.metrics_key(run, phase)))
    result = WeightPhaseResult(
        final_step=step,
        checkpoint=layout.checkpoint_prefix(run, step),
        rollouts=sum(line.rollouts for line in lines),
        stopped_by=stopped_by,
        empty_steps=empty_steps(lines),
        sandbox_isolation=sandbox_isolation,
    )
    store.write_json(layout.result_key(run, phase), result.to_wire())
    return result


def _keep_metrics_up_to(store: Store, run: str, phase: str, step: int) -> list[WeightStepMetrics]:
    """Drop metrics lines of steps after ``step`` (an attempt killed after its last checkpoint
    logged steps that are now trained again), so every step has exactly one line."""
    key = layout.metrics_key(run, phase)
    raw = store.read_jsonl(key)
    pairs = [(line, step_lines([line])) for line in raw]  # an unparsed line is dropped with the later steps
    kept = [(line, parsed[0]) for line, parsed in pairs if parsed and parsed[0].step <= step]
    if len(kept) != len(raw):
        store.write_bytes(key, "".join(ckpt.dump_json_line(line) + "\n" for line, _ in kept).encode("utf-8"))
    return [parsed for _, parsed in kept]


@dataclass
class WeightPhase:
    """One weight phase's loop with its components (see the module doc)."""

    store: Store
    run: str
    phase: str
    args: WeightPhaseArgs
    cfg: RSFTConfig
    items: Sequence[dict[str, Any]]
    model: Any
    tokenizer: Any
    trainer: SFTTrainer | LeaderTrainer  # LeaderTrainer: rank 0 of a data-parallel group
    sampler: Sampler
    sync: WeightSync
    #: held while the optimiser changes the weights (an in-process sampler shares the model)
    weights_lock: Any = None
    clock: Callable[[], float] = time.perf_counter
    #: hears where the phase is (see the module doc); None: nobody listens
    progress: Callable[[PhaseProgress], None] | None = None
    #: writes checkpoints and resume state (None: one made from ``cfg.async_checkpoint``)
    writer: CheckpointWriter | None = None
    checkpoints: CheckpointWriter = field(init=False)

    def __post_init__(self) -> None:
        self.resume = step_resume(self.cfg.step_resume, self.model)
        #: steps saved only as light resume points (deleted once a later save is complete), and the last save
        self._light_steps: list[int] = []
        self._last_saved: int | None = None
        self.order = PromptOrder(len(self.items), self.cfg.prompts_per_step, self.cfg.seed)
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        extra_ids = [extra] if isinstance(extra, int) else list(extra or [])
        self.stop_ids = stop_token_ids(self.tokenizer, extra_ids)
        self.save_steps = frozenset(self.args.save_steps)
        self.checkpoints = self.writer or CheckpointWriter(
            self.store, self.run, self.phase, background=self.cfg.async_checkpoint
        )
        first = next(iter(self.model.parameters()), None) if hasattr(self.model, "parameters") else None
        #: the trainer's device type, in every metrics line: a step on cpu held no GPU (GPU-hours)
        self.device_type: str | None = first.device.type if first is not None else None

    # ----- one step -------------------------------------------------------------------------------

    def encode(self, kept: Sequence[Trajectory]) -> list[Example]:
        return encode_trajectories(
            self.tokenizer, kept, stop_ids=self.stop_ids, max_length=self.cfg.max_seq_len, sequences=self.cfg.sequences
        )

    def report(self, stage: ProgressStage, step: int, **fields: Any) -> None:
        if self.progress is not None:
            self.progress(PhaseProgress(stage=stage, step=step, **fields))

    def train(self, examples: Sequence[Example], s: int) -> Any:
        """One SFT update of global step ``s`` (0-based) on ``examples``, with the step's learning rate and
        seed, holding the weights lock; the trainer's stats."""
        lock = self.weights_lock
        if lock is not None:
            lock.acquire()
        try:
            return self.trainer.train(examples, lr=lr_at(s, self.cfg), seed=_step_seed(self.cfg.seed, s))
        finally:
            if lock is not None:
                lock.release()

    def step(self, s: int) -> dict[str, Any]:
        """Global step ``s`` (0-based); returns its metrics line."""
        indices = self.order.indices(s)
        seed = _step_seed(self.cfg.seed, s)
        torch.manual_seed(seed)
        self.report(
            ProgressStage.SAMPLING, s + 1, done=0, total=len(indices) * self.cfg.rollouts_per_prompt, unit="rollouts"
        )
        t0 = self.clock()
        trajectories = self.sampler.sample(
            [self.items[i] for i in indices], indices, self.cfg.rollouts_per_prompt, seed
        )
        t1 = self.clock()
        if not trajectories:
            raise WeightPhaseError(f"step {s + 1}: the sampler returned no rollouts for {len(indices)} prompts")
        selection = select(trajectories, self.cfg.score_threshold)
        # the step's reward is known now: report it before the SFT update (the metrics line comes after it)
        self.report(
            ProgressStage.TRAINING,
            s + 1,
            reward_mean=selection.reward_mean,
            acceptance_rate=selection.acceptance_rate,
            kept=len(selection.kept),
            rollouts=selection.rollouts,
        )
        lr = lr_at(s, self.cfg)
        loss, tokens, t_train, updates = None, 0, 0.0, 0
        examples = self.encode(selection.kept) if selection.kept else []
        if examples:
            stats = self.train(examples, s)
            loss, tokens, t_train, updates = stats.loss, stats.tokens, stats.seconds, stats.updates
        if self.resume is StepResume.REPLAY:  # before the metrics line: a logged step always has its record
            ckpt.save_replay(self.store, self.run, self.phase, s + 1, examples)
        if not selection.kept:
            log.warning(
                "step %d kept no trajectory: no reward of its %d rollouts is above scoreThreshold %g (reward "
                "mean %.3f); SFT skipped, the weights did not move",
                s + 1,
                selection.rollouts,
                self.cfg.score_threshold,
                selection.reward_mean,
            )
        t2 = self.clock()
        if selection.kept:
            self.report(
                ProgressStage.SYNCING,
                s + 1,
                reward_mean=selection.reward_mean,
                acceptance_rate=selection.acceptance_rate,
                kept=len(selection.kept),
                rollouts=selection.rollouts,
            )
        t_sync = self.sync.sync(self.model, self.tokenizer, s + 1) if selection.kept else 0.0
        metrics = WeightStepMetrics(
            step=s + 1,
            epoch=(s + 1) / self.cfg.steps_per_epoch,
            reward_mean=selection.reward_mean,
            acceptance_rate=selection.acceptance_rate,
            kept=len(selection.kept),
            loss=loss,
            learning_rate=lr,
            rollouts=selection.rollouts,
            tokens_trained=tokens,
            seconds_sampling=t1 - t0,
            seconds_training=t_train or (t2 - t1 if selection.kept else 0.0),
            seconds_syncing=t_sync,
            tokens_per_second=(tokens / t_train) if t_train else 0.0,
            device=self.device_type,
        ).to_wire()
        # Extra keys (readers ignore unknown fields): the data order, for audits and resume checks, and the
        # optimiser updates made.
        metrics["prompts"] = indices
        metrics["optimizerUpdates"] = updates
        metrics["dataEpoch"] = self.order.slots(s)[0].epoch
        return metrics

    # ----- the phase ------------------------------------------------------------------------------

    def save(self, step: int, light: bool = False) -> None:
        """Checkpoint (marker last), then the resume state that points at it; in the background with
        ``rsft.asyncCheckpoint`` (this returns once the state is copied to host memory). ``light``: only a
        resume point (``rsft.stepResume``), deleted once a later save is complete."""
        if not light:
            self.report(ProgressStage.CHECKPOINTING, step)
        blocked = self.checkpoints.save(
            step,
            self.model,
            self.tokenizer,
            self.trainer.optimizer_state,
            {
                "cursor": self.order.cursor(step),
                "seed": self.cfg.seed,
                "promptsPerStep": self.cfg.prompts_per_step,
                "datasetSize": len(self.items),
            },
        )
        log.info("%s of step %d: the trainer waited %.2f s", "resume point" if light else "checkpoint", step, blocked)
        # the writer waits for the previous write before it takes a new one: the previous save is complete now,
        # so the light points before it are resume points no more
        previous, self._last_saved = self._last_saved, step
        if light:
            self._light_steps.append(step)
        if previous is not None:
            self.prune_light(below=previous)
            ckpt.prune_replay(self.store, self.run, self.phase, up_to=previous)

    def prune_light(self, below: int) -> None:
        """Delete the light resume points (their checkpoints) before step ``below``, whose save is complete."""
        for step in [s for s in self._light_steps if s < below]:
            self.store.delete_prefix(layout.checkpoint_prefix(self.run, step) + "/")
            self._light_steps.remove(step)

    def adopt_light_points(self, start: StartPoint) -> None:
        """A resumed attempt: the light points an earlier attempt left (up to the one it resumes from) are
        deleted with this attempt's own once a later save is complete."""
        if not start.resumed:
            return
        target = self.args.target_step
        for entry in self.store.list(layout.checkpoints_prefix(self.run) + "/", recursive=False):
            step = layout.parse_checkpoint_step(entry.rstrip("/").rsplit("/", 1)[-1])
            if (
                step is not None
                and self.args.from_step < step <= start.step
                and not should_checkpoint(step, self.cfg, self.save_steps, target)
            ):
                self._light_steps.append(step)
        self._last_saved = start.step

    def run_from(self, start: StartPoint) -> WeightPhaseResult:
        try:
            self.adopt_light_points(start)
            step, stopped_by = self._steps(start)
            self.checkpoints.wait()  # a checkpoint counts once written; its error surfaces here at the latest
            if not ckpt.checkpoint_complete(self.store, self.run, step) or step in self._light_steps:
                if step in self._light_steps:  # the phase ends on a light point: make it a checkpoint to keep
                    self._light_steps.remove(step)
                self.save(step)
                self.checkpoints.wait()
            self.prune_light(below=step + 1)
            ckpt.prune_replay(self.store, self.run, self.phase, up_to=step)
        except BaseException:
            self.checkpoints.close_after_error()
            raise
        return finish(
            self.store,
            self.run,
            self.phase,
            step,
            stopped_by,
            getattr(getattr(self.sampler, "limits", None), "isolation", None),
        )

    def replay(self, steps: Sequence[int]) -> None:
        """Train the steps a killed attempt did after its last checkpoint again from their replay records, in
        order, with their own learning rates and seeds (no sampling), then sync the weights once. Nothing is
        reported as progress: these steps are done, and the display must not show one as current again."""
        trained = False
        for done in steps:
            examples = ckpt.load_replay(self.store, self.run, self.phase, done)
            if not examples:
                continue  # the step kept nothing: its weights did not move
            self.train(examples, done - 1)
            trained = True
        if steps:
            log.info(
                "phase %s: trained steps %d-%d again from their replay records (kept trajectories), sampling none",
                self.phase,
                steps[0],
                steps[-1],
            )
        if trained:
            self.sync.sync(self.model, self.tokenizer, steps[-1])

    def _steps(self, start: StartPoint) -> tuple[int, StopReason]:
        """The steps up to the target or a stop, checkpointing as asked; (steps done, why it stopped)."""
        target = self.args.target_step
        logged = [line.step for line in step_lines(self.store.read_jsonl(layout.metrics_key(self.run, self.phase)))]
        redo = [s for s in ckpt.replay_steps(self.store, self.run, self.phase, start.step, logged) if s <= target]
        lines = _keep_metrics_up_to(self.store, self.run, self.phase, start.step + len(redo))
        rewards = [line.reward_mean for line in lines]
        stopped_by: StopReason = "target"
        self.replay(redo)
        step = start.step + len(redo)
        rule = self.args.stop_rule
        if rule is not None and rewards and weight_should_stop(rewards, rule):
            stopped_by = "patience"  # the killed attempt had already reached the stop
        freeze_long_lived()  # the model, optimiser and libraries: no full collection walks them again
        while step < target and stopped_by == "target":
            if self.store.exists(layout.stop_key(self.run, self.phase)):
                stopped_by = "stop-request"
                break
            line = self.step(step)
            if step == start.step:
                freeze_long_lived()  # and what the first step made to last: compiled graphs, connections
            step += 1
            self.store.append_jsonl(layout.metrics_key(self.run, self.phase), line)
            done = WeightStepMetrics.model_validate(line)
            rewards.append(done.reward_mean)
            log.info("step %d/%d reward %.3f kept %d loss %s", step, target, done.reward_mean, done.kept, done.loss)
            if rule is not None and weight_should_stop(rewards, rule):
                stopped_by = "patience"
            if should_checkpoint(step, self.cfg, self.save_steps, target) or stopped_by != "target":
                self.save(step)
            elif self.resume is StepResume.CHECKPOINT:  # so an interruption before the next step resumes there
                self.save(step, light=True)
        if stopped_by == "stop-request" and self.store.exists(layout.stop_key(self.run, self.phase)):
            log.info("stop requested; ending phase %s at step %d", self.phase, step)
        return step, stopped_by


#: rsft.stepResume auto: a light resume point after every step when the weights and Adam's two moments
#: (fp32: 12 bytes a parameter) take at most this much (SmolLM2-135M: 1.6 GB; Qwen3.5-4B: 48 GB, not: replay)
LIGHT_RESUME_MAX_BYTES = 4 * 2**30


class StepResume(enum.Enum):
    """What a weight phase saves after every step so that an interrupted one resumes at the next step."""

    #: a light resume point: a checkpoint of the weights with the optimiser state (deleted once a later is saved)
    CHECKPOINT = "checkpoint"
    #: a replay record: the step's kept sequences; the resume trains the steps since the last checkpoint again
    REPLAY = "replay"
    #: nothing: the resume samples the steps since the last checkpoint again
    NONE = "none"


def step_resume(mode: str, model: Any, max_bytes: int = LIGHT_RESUME_MAX_BYTES) -> StepResume:
    """``rsft.stepResume`` resolved for ``model``: auto = a light point when the weights and Adam moments take
    at most ``max_bytes``, else a replay record (a model whose parameters cannot be counted: replay too)."""
    if mode != "auto":
        return {"on": StepResume.CHECKPOINT, "replay": StepResume.REPLAY}.get(mode, StepResume.NONE)
    params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else None
    return StepResume.CHECKPOINT if params is not None and 12 * params <= max_bytes else StepResume.REPLAY


def _step_seed(seed: int, step: int) -> int:
    """A per-step seed from the run seed (sampling RNG, minibatch shuffles)."""
    return (seed * 1_000_003 + step * 7919 + 12345) % (2**31 - 1)
