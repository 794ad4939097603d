"""Data-parallel weight phase under torchrun: rank 0 leads, every other rank follows.

Only rank 0 (the *leader*) reads the request, samples rollouts through the harness runtime,
rejects, tokenises, and talks to the store (metrics, checkpoints, resume state, STOP, result). The
other ranks (*followers*) never see the store: the leader sends them, over the process group,

* at the start: the request (spec + args), the model's config and pad id, then the start weights
  and optimiser state tensor by tensor (:func:`broadcast_tree`), so every rank starts identical;
* per RSFT step with kept trajectories: ``("train", examples, lr, seed)``; every rank then runs
  :meth:`SFTTrainer.train` on its shard (``minibatch[rank::world]``) with the token count and the
  gradients all-reduced, so the update is the single-process token-mean update and the replicas
  stay identical;
* ``("collect", what)`` when a checkpoint needs state that lives on every rank (DeepSpeed ZeRO);
* ``("end",)`` after the result is written, or ``("abort", reason)`` when the leader failed
  outside a collective (the followers then exit non-zero too).

All-or-nothing: any rank that dies makes torchrun stop the others and exit non-zero, so the Job
(``backoffLimit: 0``) fails and the controller's next attempt resumes from the last checkpoint.
A follower blocked in a collective when the leader fails is released by torchrun (or, at worst,
by the process-group timeout, :data:`TIMEOUT_ENV`).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

LEADER = 0
#: seconds a collective may wait (a rank blocked on a dead peer gives up after this)
TIMEOUT_ENV = "WHALE_DIST_TIMEOUT_S"


class FollowerAbort(RuntimeError):
    """The leader failed; this rank stops with it (the message carries the leader's reason)."""


@dataclass(frozen=True)
class World:
    """This process's place in a torchrun launch (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world_from_env(env: Mapping[str, str] | None = None) -> World:
    """The launch torchrun describes in the environment; one process when ``WORLD_SIZE`` is unset or 1."""
    env = os.environ if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise ValueError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers (set by torchrun): {exc}") from exc
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"RANK={rank} WORLD_SIZE={size}: need 0 <= RANK < WORLD_SIZE (launch with torchrun)")
    return World(rank=rank, size=size, local_rank=local)


def device_for(world: World) -> torch.device:
    """``cuda:LOCAL_RANK`` when GPUs exist (one GPU per process), else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
    return torch.device("cpu")


def init_process_group(world: World, device: torch.device) -> None:
    """NCCL on GPUs, gloo on the CPU; rendezvous from torchrun's ``MASTER_ADDR``/``MASTER_PORT``."""
    if torch.distributed.is_initialized():
        return
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "1800")))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda" and device.index is None:  # NCCL binds to one numbered device
        device = torch.device("cuda", torch.cuda.current_device())
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    torch.distributed.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=timeout, **kwargs)
    log.info("rank %d/%d joined the %s process group", world.rank, world.size, backend)


def barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def shutdown() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _object_device() -> torch.device:
    """Where broadcast_object_list stages its bytes: the current GPU under NCCL."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_object(obj: Any = None) -> Any:
    """The leader's ``obj`` on every rank (pickled; for small messages: commands, token ids)."""
    box = [obj if torch.distributed.get_rank() == LEADER else None]
    torch.distributed.broadcast_object_list(box, src=LEADER, device=_object_device())
    return box[0]


@dataclass(frozen=True)
class _TensorRef:
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _strip(tree: Any, out: list[torch.Tensor]) -> Any:
    if isinstance(tree, torch.Tensor):
        out.append(tree)
        return _TensorRef(len(out) - 1, tuple(tree.shape), tree.dtype)
    if isinstance(tree, dict):
        return {k: _strip(v, out) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_strip(v, out) for v in tree)
    return tree


def _fill(tree: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(tree, _TensorRef):
        return tensors[tree.index]
    if isinstance(tree, dict):
        return {k: _fill(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, tensors) for v in tree)
    return tree


def broadcast_tree(tree: Any, device: torch.device) -> Any:
    """The leader's nested dict/list of tensors (an optimiser state) on every rank, on the CPU.

    The structure goes pickled, the tensors one ``broadcast`` each (no pickling of large data)."""
    tensors: list[torch.Tensor] = []
    skeleton = broadcast_object(_strip(tree, tensors) if torch.distributed.get_rank() == LEADER else None)
    if torch.distributed.get_rank() != LEADER:
        refs: list[_TensorRef] = []
        _strip_refs(skeleton, refs)
        tensors = [torch.empty(r.shape, dtype=r.dtype) for r in sorted(refs, key=lambda r: r.index)]
    received = []
    for t in tensors:
        buf = t.to(device) if t.device != device else t.clone()
        torch.distributed.broadcast(buf, src=LEADER)
        received.append(buf.cpu())
    return _fill(skeleton, received)


def _strip_refs(tree: Any, out: list[_TensorRef]) -> None:
    if isinstance(tree, _TensorRef):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            _strip_refs(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _strip_refs(v, out)


def broadcast_module(model: torch.nn.Module) -> None:
    """Overwrite every rank's parameters and buffers with the leader's, in place (same architecture)."""
    with torch.no_grad():
        for t in model.state_dict(keep_vars=False).values():
            torch.distributed.broadcast(t, src=LEADER)
    log.debug("module state broadcast from the leader")


# ----- the step protocol ----------------------------------------------------------------------------


class LeaderTrainer:
    """The trainer as the loop on rank 0 sees it: every call that needs all ranks first tells the
    followers to do the same (see the module doc). Otherwise it is the wrapped trainer."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        #: True while the ranks are inside a collective step (an abort message would not be heard)
        self.in_collective = False

    def train(self, examples: Sequence[Any], *, lr: float, seed: str | int) -> Any:
        self.in_collective = True
        broadcast_object(("train", list(examples), lr, seed))
        stats = self.trainer.train(examples, lr=lr, seed=seed)
        self.in_collective = False
        return stats

    def optimizer_state(self) -> dict[str, Any]:
        if getattr(self.trainer, "collective_state", False):
            self.in_collective = True
            broadcast_object(("collect", "optimizer"))
            state = self.trainer.optimizer_state()
            self.in_collective = False
            return state
        return self.trainer.optimizer_state()

    def gathered_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full weights on the leader when they are sharded (ZeRO-3), else None (the module has them)."""
        if not getattr(self.trainer, "collective_state", False):
            return None
        self.in_collective = True
        broadcast_object(("collect", "weights"))
        state = self.trainer.gathered_state_dict()
        self.in_collective = False
        return state

    def end(self) -> None:
        broadcast_object(("end",))

    def abort(self, reason: str) -> None:
        """Tell the followers to stop, if they can still hear it (best effort)."""
        if self.in_collective:
            return
        try:
            broadcast_object(("abort", reason))
        except Exception:  # the group may already be broken; torchrun stops the rest
            log.warning("could not tell the other ranks to abort", exc_info=True)


def follow(trainer: Any) -> int:
    """A follower's whole phase: do what the leader says until it ends. Returns the SFT calls made."""
    calls = 0
    while True:
        message = broadcast_object(None)
        kind = message[0]
        if kind == "train":
            _, examples, lr, seed = message
            torch.manual_seed(int(seed) if isinstance(seed, int) else 0)
            trainer.train(examples, lr=lr, seed=seed)
            calls += 1
        elif kind == "collect":
            if message[1] == "optimizer":
                trainer.optimizer_state()
            else:
                trainer.gathered_state_dict()
        elif kind == "end":
            return calls
        elif kind == "abort":
            raise FollowerAbort(f"rank 0 failed: {message[1]}")
        else:
            raise FollowerAbort(f"unknown message from rank 0: {kind!r}")


class GatheringModel:
    """The model as the leader's checkpoint and weight-sync code see it: ``save_pretrained`` first
    gathers sharded weights from every rank (ZeRO-3); everything else is the model itself."""

    def __init__(self, model: Any, leader: LeaderTrainer):
        self._model = model
        self._leader = leader

    def save_pretrained(self, path: Any, **kwargs: Any) -> Any:
        state = self._leader.gathered_state_dict()
        if state is not None:
            kwargs["state_dict"] = state
        return self._model.save_pretrained(path, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The full weights (gathered from every rank when sharded): what a checkpoint snapshot copies."""
        state = self._leader.gathered_state_dict()
        return state if state is not None else self._model.state_dict()

    @property
    def unwrapped(self) -> Any:
        """The model itself, which writes a snapshot's files without gathering again."""
        return self._model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
