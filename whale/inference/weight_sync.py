"""The vLLM pod's weight sync: serve what ``control/serving.json`` names, with no pod restart.

``python -m whale.inference.weight_sync --store URI --run RUN --model NAME --dest /models
[--revision R] (--once | --server URL)``

The operator's vLLM Deployment runs it twice: as the init container (``--once``: materialise the
current serving target so vLLM starts on it) and as a sidecar (``--server``: keep following the
target). Layout under ``--dest``::

    slot-0/, slot-1/   store checkpoints, downloaded alternately (never the folder being served)
    current            a symlink vLLM is started on (``vllm serve /models/current``)
    current.json       {"checkpoint": ..., "version": ...}: what ``current`` holds

The serving target ``{"checkpoint": key | null, "version": v?}`` names a store prefix (a phase
checkpoint, or a trainer's per-step sync folder) or null for the base model ``--model``: a local
folder (an image-baked model such as /opt/whale/models/synthetic-tiny) is linked, nothing copied; a
Hugging Face id is resolved to its snapshot in the hub cache ($HF_HOME, on the pod's volume),
downloaded once on first use exactly as ``vllm serve <id>`` would. After vLLM reloads (dev-mode
endpoints, :mod:`whale.inference.vllm_control`) the sidecar writes the acknowledgement
``control/served.json`` {"checkpoint", "version", "at"} that trainers and the operator wait for, then rings
the operator's doorbell (:mod:`whale.inference.doorbell`: the same acknowledgement on a ConfigMap the operator
watches, so a run waiting for it wakes at once).

Transient failures (store or server unreachable) are retried every poll; a server without dev
mode is a configuration error: exit non-zero with the fix. On a cluster the sidecar authenticates with the
run's vLLM API key (``$WHALE_INFERENCE_API_KEY``, read by :class:`VLLMControl`; the init container needs none).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale.core import layout
from whale.inference.doorbell import Doorbell
from whale.inference.vllm_control import VLLMControl, WeightSyncError

log = logging.getLogger("whale.inference.weight_sync")

CURRENT = "current"
CURRENT_INFO = "current.json"
SLOTS = ("slot-0", "slot-1")


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_target(store: Any, run: str) -> dict[str, Any]:
    """The serving target; none written yet means the base model."""
    raw = store.read_json_or_none(layout.serving_key(run))
    if raw is None:
        return {"checkpoint": None}
    if not isinstance(raw, dict) or "checkpoint" not in raw:
        raise WeightSyncError(
            f'{store.uri_for(layout.serving_key(run))} must be {{"checkpoint": key | null}}, got {raw!r}'
        )
    return {"checkpoint": raw["checkpoint"], **({"version": raw["version"]} if raw.get("version") else {})}


def resolve_base(model: str, revision: str | None) -> Path:
    """The base model as a local folder: a folder as is, else the hub snapshot (cached)."""
    if Path(model).is_dir():
        return Path(model).resolve()
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, revision=revision))
    except Exception as exc:  # noqa: BLE001 - hub errors are many; the message matters
        raise WeightSyncError(
            f"base model {model!r} (spec.experiment.model.name) is neither a local folder nor a "
            f"downloadable Hugging Face repository: {exc}"
        ) from None


@dataclass
class WeightSyncer:
    """Materialise serving targets under ``dest`` and (with ``control``) reload vLLM on them."""

    store: Any
    run: str
    model: str
    dest: Path
    revision: str | None = None
    control: VLLMControl | None = None
    #: the operator's doorbell, rung after each acknowledgement (None: no operator watches, e.g. a local run)
    doorbell: Doorbell | None = None

    def current(self) -> dict[str, Any] | None:
        path = self.dest / CURRENT_INFO
        return json.loads(path.read_text()) if path.is_file() else None

    def materialise(self, target: dict[str, Any]) -> Path:
        """A local folder holding ``target``'s weights, never the one ``current`` points at."""
        checkpoint = target["checkpoint"]
        if checkpoint is None:
            return resolve_base(self.model, self.revision)
        link = self.dest / CURRENT
        busy = os.path.realpath(link) if link.is_symlink() else None
        slot = next(self.dest / s for s in SLOTS if str((self.dest / s).resolve()) != busy)
        if slot.exists():
            shutil.rmtree(slot)
        marker = layout.CHECKPOINT_COMPLETE_MARKER
        self.store.download_dir(checkpoint.rstrip("/"), slot, marker=marker)
        (slot / marker).unlink(missing_ok=True)
        return slot

    def point(self, folder: Path, target: dict[str, Any]) -> None:
        """Atomically make ``current`` the link to ``folder`` and record what it holds."""
        tmp = self.dest / f".{CURRENT}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(folder)
        os.replace(tmp, self.dest / CURRENT)
        self._record(target)

    def _record(self, target: dict[str, Any]) -> None:
        info = self.dest / f".{CURRENT_INFO}.tmp"
        info.write_text(json.dumps(target))
        os.replace(info, self.dest / CURRENT_INFO)

    def acknowledge(self, target: dict[str, Any]) -> None:
        """The acknowledgement in the store (the record), then on the doorbell (the operator's wake-up)."""
        ack = {**target, "at": utc_now()}
        self.store.write_json(layout.served_key(self.run), ack)
        if self.doorbell is not None:
            self.doorbell.ring(ack)

    def prepare_once(self) -> dict[str, Any]:
        """The init container: the current target on disk, ``current`` pointing at it."""
        self.dest.mkdir(parents=True, exist_ok=True)
        target = read_target(self.store, self.run)
        self.point(self.materialise(target), target)
        log.info("materialised %s at %s", target["checkpoint"] or f"base model {self.model}", self.dest / CURRENT)
        return target

    def needs_reload(self, current: dict[str, Any] | None, target: dict[str, Any]) -> bool:
        """Phase checkpoints and the base model never change under their name, so the same name is
        the same weights; a trainer's sync folder is re-published under the same step name by a
        resumed attempt, so there a new ``version`` means new weights."""
        if current is None or current.get("checkpoint") != target["checkpoint"]:
            return True
        key = target["checkpoint"]
        return (
            key is not None
            and key.startswith(layout.sync_prefix(self.run) + "/")
            and current.get("version") != target.get("version")
        )

    def _control(self) -> VLLMControl:
        if self.control is None:
            raise WeightSyncError("no vLLM control endpoint: this syncer only materialises (init container)")
        return self.control

    def step(self) -> bool:
        """One poll: reload when the target changed; True when something was reloaded."""
        control = self._control()
        target = read_target(self.store, self.run)
        current = self.current()
        if target == current:
            return False
        if not self.needs_reload(current, target):  # same weights, a new request: acknowledge it
            self._record(target)
            self.acknowledge(target)
            return False
        folder = self.materialise(target)
        control.reload_from(str(folder))
        self.point(folder, target)
        self.acknowledge(target)
        return True

    def follow(self, poll_s: float = 2.0, stop: Any = None, startup_timeout_s: float = 3600.0) -> None:
        """The sidecar: acknowledge what vLLM started on once it is healthy, then follow the target.
        ``stop`` (an Event) ends the loop (tests)."""
        control = self._control()
        deadline = time.monotonic() + startup_timeout_s
        while not control.healthy():
            if stop is not None and stop.is_set():
                return
            if time.monotonic() > deadline:
                raise WeightSyncError(f"vLLM at {control.base_url} not healthy after {startup_timeout_s:.0f} s")
            time.sleep(poll_s)
        started = self.current()
        if started is not None:
            self.acknowledge(started)
        while stop is None or not stop.is_set():
            try:
                self.step()
            except WeightSyncError as exc:
                if "VLLM_SERVER_DEV_MODE" in str(exc):
                    raise
                log.warning("%s; retrying in %.0f s", exc, poll_s)
            except OSError as exc:  # store hiccups: retry
                log.warning("weight sync: %s; retrying in %.0f s", exc, poll_s)
            if stop is not None:
                if stop.wait(poll_s):
                    return
            else:
                time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m whale.inference.weight_sync", description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="store URI (file:///path or s3://bucket/prefix)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--model", required=True, help="the base model: a local folder or a Hugging Face id")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--dest", required=True, type=Path, help="folder holding slot-0/, slot-1/ and current")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="materialise the target and exit (init container)")
    mode.add_argument("--server", help="vLLM base URL to reload (sidecar), e.g. http://127.0.0.1:8000")
    parser.add_argument("--poll-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from whale.store import open_store

        syncer = WeightSyncer(
            open_store(args.store),
            args.run,
            args.model,
            args.dest,
            args.revision,
            None if args.once else VLLMControl(args.server),
            None if args.once else Doorbell.from_environment(),
        )
        if args.once:
            syncer.prepare_once()
        else:
            syncer.follow(args.poll_s)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line for the container's termination message
        log.exception("weight sync failed")
        print(f"weight sync failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
