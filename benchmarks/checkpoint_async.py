"""How long a checkpoint holds the trainer: synchronous write vs the asynchronous writer (issue #17).

``whale.rsft.checkpoint_writer.CheckpointWriter`` is what the weight phase checkpoints through
(``rsft.asyncCheckpoint``). This script makes a Qwen3-layout model with random weights on the device there
is (CUDA if present), gives it a real AdamW update (so the state holds 2 fp32 moments per parameter), and
checkpoints it ``--checkpoints`` times into a local-folder store, with ``--updates-between`` real updates of
the model after each checkpoint (the next step's work, which the background write overlaps), once with
``background=False`` (the old path: the trainer waits for every file) and once with ``background=True``
(the trainer waits for the host snapshot only), in one process, side by side. Per variant: the seconds the
trainer was held by each ``save`` (the first one of the asynchronous writer also allocates its pinned host
buffers), each write's duration, the updates' time after each checkpoint (slower while a write runs beside
them: the disk and the host copies share the machine), and what was left of the write after those updates
(what the next checkpoint or the phase end would wait if it came right after them; in a run checkpoints
come at evaluation points, many steps apart, so each write is let finish before the next). Each
checkpoint is read back and checked against the state at its ``save`` (per-tensor float64 sums of the
weights and the optimiser state: the updates after the snapshot must not be in it). The store keeps one
checkpoint at a time (a 1.7 B model's is 20 GB, written via temporary files; the GPU machine's disk
holds about 64 GB).

    PYTHONPATH=. python benchmarks/checkpoint_async.py --json out.json                      # ~110 M parameters
    PYTHONPATH=. python benchmarks/checkpoint_async.py --model qwen3-1.7b --checkpoints 2 --json out.json  # H200
    PYTHONPATH=. python benchmarks/checkpoint_async.py --smoke                              # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUN, PHASE = "bench", "c01-weight"

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3-1.7B (config.json of Qwen/Qwen3-1.7B)
    "qwen3-1.7b": dict(hidden=2048, layers=28, vocab=151936, inter=6144, heads=16, kv=8, head_dim=128),
    "110m": dict(hidden=768, layers=12, vocab=32000, inter=2048, heads=12, kv=4, head_dim=64),
    "smoke": dict(hidden=64, layers=2, vocab=512, inter=128, heads=4, kv=2, head_dim=16),
}


def tokenizer() -> Any:
    """A small real tokenizer (what a checkpoint saves beside the weights)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")), unk_token="<unk>"
    )


def build_model(shape: dict[str, Any], device: torch.device) -> Any:
    """A Qwen3-layout model of ``shape`` with random fp32 weights (seed 0, tied embeddings) on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=shape["inter"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"],
        head_dim=shape["head_dim"],
        tie_word_embeddings=True,
    )
    with torch.device(device):
        return Qwen3ForCausalLM._from_config(config, dtype=torch.float32)


def build(shape: dict[str, Any], device: torch.device) -> tuple[Any, Any]:
    model = build_model(shape, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    return model, optimizer


def update(model: Any, optimizer: Any, device: torch.device, seq: int) -> float:
    """One real training update (the work the next RSFT step does); returns its seconds."""
    start = time.perf_counter()
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def checksums(tensors: list[torch.Tensor]) -> list[float]:
    """Each tensor's float64 sum (on its device: cheap next to the write)."""
    return [float(t.detach().double().sum()) for t in tensors]


def state_tensors(weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> list[torch.Tensor]:
    """The weights by name, then the optimiser state's tensors in its order (tied weights once)."""
    seen: set[int] = set()
    out = []
    for name in sorted(weights):
        if weights[name].data_ptr() not in seen:
            seen.add(weights[name].data_ptr())
            out.append(weights[name])
    for index in sorted(optimizer_state["state"]):
        entry = optimizer_state["state"][index]
        out.extend(entry[k] for k in sorted(entry))
    return out


def written_state(store: Any, step: int) -> list[torch.Tensor]:
    """The tensors of the checkpoint and resume state of ``step`` as written (read back from the files)."""
    from safetensors.torch import load_file

    from whale.core import layout
    from whale.rsft import checkpoint as ckpt

    folder = store.local_path(layout.checkpoint_prefix(RUN, step))
    weights: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    state = torch.load(
        store.local_path(f"{layout.state_prefix(RUN, PHASE)}/{ckpt.step_dirname(step)}/{ckpt.OPTIMIZER_FILE}"),
        weights_only=True,
    )
    return state_tensors(weights, state)


def run(background: bool, args: argparse.Namespace, device: torch.device, root: Path) -> dict[str, Any]:
    """Checkpoint ``args.checkpoints`` times with updates between; each write is read back and checked
    against the state at its snapshot (the updates after ``save`` must not leak into it). The store keeps
    one checkpoint (the older one is deleted before the next save): a 1.7 B model's checkpoint and state
    are 20 GB, written via temporary files."""
    from whale.core import layout
    from whale.rsft.checkpoint_writer import CheckpointWriter
    from whale.store.local import LocalStore

    model, optimizer = build(SHAPES[args.model], device)
    tok = tokenizer()
    update(model, optimizer, device, args.seq)
    store = LocalStore(root)
    writer = CheckpointWriter(store, RUN, PHASE, background=background)
    blocked, updates, waited, exact = [], [], [], []
    for step in range(1, args.checkpoints + 1):
        if step > 1:  # one checkpoint on disk at a time
            store.delete_prefix(layout.checkpoint_prefix(RUN, step - 1) + "/")
            store.delete_prefix(layout.state_prefix(RUN, PHASE) + "/")
        expected = checksums(state_tensors(model.state_dict(), optimizer.state_dict()))
        blocked.append(writer.save(step, model, tok, optimizer.state_dict, {"cursor": step}))
        updates.append(sum(update(model, optimizer, device, args.seq) for _ in range(args.updates_between)))
        # checkpoints come steps apart in a run: let this write finish before the next one, and time what is
        # left of it after the updates (what a checkpoint right after them, or the phase end, would wait)
        wait_start = time.perf_counter()
        writer.wait()
        waited.append(time.perf_counter() - wait_start)
        got = checksums(written_state(store, step))
        exact.append(
            len(got) == len(expected)
            and all(abs(a - b) <= 1e-9 * max(1.0, abs(b)) for a, b in zip(got, expected, strict=True))
        )
    params = sum(p.numel() for p in model.parameters())
    del model, optimizer
    shutil.rmtree(root, ignore_errors=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "variant": "async" if background else "sync",
        "parameters": params,
        "blocked_s": blocked,
        "blocked_median_s": statistics.median(blocked),
        "blocked_after_first_median_s": statistics.median(blocked[1:]) if len(blocked) > 1 else blocked[0],
        "write_s": writer.write_s,
        "updates_between_s": updates,
        "waited_after_updates_s": waited,
        # every checkpoint read back equals the state at its save (float64 sums per tensor)
        "written_equals_snapshot": all(exact),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="110m")
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--updates-between", type=int, default=2, help="training updates between checkpoints")
    parser.add_argument("--seq", type=int, default=512, help="tokens of each update")
    parser.add_argument("--dir", type=Path, default=None, help="the store's disk (default: $TMPDIR)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 checkpoints (CPU smoke test)")
    parser.add_argument("--json", "--out", dest="out", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.checkpoints, args.updates_between, args.seq = "smoke", 2, 1, 32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    with tempfile.TemporaryDirectory(prefix="whale-ckpt-bench-", dir=args.dir) as tmp:
        for background in (False, True):
            results.append(run(background, args, device, Path(tmp) / ("async" if background else "sync")))
            print(json.dumps(results[-1]), flush=True)
    identical = all(r["written_equals_snapshot"] for r in results)
    sync, async_ = results
    report = {
        "meta": {
            "model": args.model,
            "shape": SHAPES[args.model],
            "checkpoints": args.checkpoints,
            "updates_between": args.updates_between,
            "seq": args.seq,
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "store": "local directory",
        },
        "results": results,
        "compare": {
            "blocked_median_s": [sync["blocked_median_s"], async_["blocked_median_s"]],
            "blocked_after_first_median_s": [
                sync["blocked_after_first_median_s"],
                async_["blocked_after_first_median_s"],
            ],
            "trainer_time_saved_per_checkpoint_s": sync["blocked_after_first_median_s"]
            - async_["blocked_after_first_median_s"],
            "written_equals_snapshot": identical,
        },
    }

    def row(values: list[float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    print(f"\n{'variant':<8} {'params':>12} {'blocked s':>22} {'write s':>22} {'updates s':>22} {'waited s':>22}")
    for r in results:
        print(
            f"{r['variant']:<8} {r['parameters']:>12,} {row(r['blocked_s']):>22} {row(r['write_s']):>22} "
            f"{row(r['updates_between_s']):>22} {row(r['waited_after_updates_s']):>22}"
        )
    print(f"every checkpoint read back equals the state at its save: {identical}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if not identical:
        raise SystemExit("checkpoint_async: a checkpoint read back differs from the state at its save")
    return report


if __name__ == "__main__":
    main()
