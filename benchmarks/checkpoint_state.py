"""Resume-state save and load, before and after streaming the optimiser state (issue #17 item 5).

The step that checkpoints was 61 s on the H200, 45 s of it the checkpoint, most of that the optimiser
state: ``save_state`` did ``torch.save`` into a ``BytesIO`` and wrote ``buf.getvalue()`` (the state held
twice in host memory). It now ``torch.save``s into ``Store.writing``'s file (a local store: its own temp file, renamed; written once). This script
times both on the CPU with a ~100 M-parameter model (Qwen3 layout, random weights, one real AdamW update,
so the state is 2 fp32 moments per parameter) and records, for each, the host memory the call added at
its peak (VmHWM after resetting it, minus VmRSS before). Each variant runs in its own process so the
peaks do not mix. ``before`` is the old code, kept verbatim below; ``after`` is
``whale.rsft.checkpoint.save_state`` / ``load_state``. The store is the local-directory backend.

    .venv/bin/python benchmarks/checkpoint_state.py [--hidden 768 --layers 12] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUN, PHASE, STEP = "bench", "c01-weight", 1


def _loaded(state: tuple[int, dict[str, Any], dict[str, Any]] | None) -> dict[str, Any]:
    """The optimiser state of a resume state that must be there."""
    if state is None:
        raise SystemExit("checkpoint_state: the state just saved did not load")
    return state[2]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def legacy_save_state(store: Any, optimizer_state: dict[str, Any]) -> None:
    """``save_state``'s optimiser write before streaming (the state as bytes in memory)."""
    import torch

    from whale.rsft import checkpoint as ckpt

    buf = io.BytesIO()
    torch.save(optimizer_state, buf)
    store.write_bytes(f"{ckpt._state_dir(RUN, PHASE, STEP)}/{ckpt.OPTIMIZER_FILE}", buf.getvalue())


def legacy_load_state(store: Any) -> dict[str, Any]:
    import torch

    from whale.rsft import checkpoint as ckpt

    key = f"{ckpt._state_dir(RUN, PHASE, STEP)}/{ckpt.OPTIMIZER_FILE}"
    return torch.load(io.BytesIO(store.read_bytes(key)), map_location="cpu", weights_only=True)


def build_state(hidden: int, layers: int, vocab: int) -> tuple[int, dict[str, Any]]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 128,
        head_dim=64,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, vocab, (2, 64))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return sum(p.numel() for p in model.parameters()), opt.state_dict()


def worker(variant: str, hidden: int, layers: int, vocab: int, repeats: int) -> dict[str, Any]:
    from whale.core import layout
    from whale.rsft import checkpoint as ckpt
    from whale.store.local import LocalStore

    params, state = build_state(hidden, layers, vocab)
    out: dict[str, Any] = {"variant": variant, "parameters": params}
    with tempfile.TemporaryDirectory(prefix="whale-bench-ckpt-") as tmp:
        store = LocalStore(Path(tmp) / "store")
        store.write_bytes(layout.checkpoint_complete_key(RUN, STEP), b"")
        saves, loads, save_peaks, load_peaks = [], [], [], []
        for _ in range(repeats):
            rss = _status_kib("VmRSS")
            _reset_peak()
            t0 = time.perf_counter()
            if variant == "before":
                legacy_save_state(store, state)
            else:
                ckpt.save_state(store, RUN, PHASE, STEP, state, {})
            saves.append(time.perf_counter() - t0)
            save_peaks.append((_status_kib("VmHWM") - rss) / 1024)
            rss = _status_kib("VmRSS")
            _reset_peak()
            t0 = time.perf_counter()
            loaded = legacy_load_state(store) if variant == "before" else _loaded(ckpt.load_state(store, RUN, PHASE))
            loads.append(time.perf_counter() - t0)
            load_peaks.append((_status_kib("VmHWM") - rss) / 1024)
            if loaded["state"].keys() != state["state"].keys():
                raise RuntimeError("the loaded state differs from the saved one")
            del loaded
        key = f"{ckpt._state_dir(RUN, PHASE, STEP)}/{ckpt.OPTIMIZER_FILE}"
        out["state_MiB"] = store.local_path(key).stat().st_size / (1 << 20)
    out.update(
        save_s=statistics.median(saves),
        load_s=statistics.median(loads),
        save_s_all=saves,
        load_s_all=loads,
        save_peak_extra_MiB=max(save_peaks),
        load_peak_extra_MiB=max(load_peaks),
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--worker", choices=["before", "after"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.hidden, args.layers, args.vocab, args.repeats)))
        return
    import torch

    results = []
    for variant in ("before", "after"):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                variant,
                "--hidden",
                str(args.hidden),
                "--layers",
                str(args.layers),
                "--vocab",
                str(args.vocab),
                "--repeats",
                str(args.repeats),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    before, after = results
    report = {
        "meta": {
            "hidden": args.hidden,
            "layers": args.layers,
            "vocab": args.vocab,
            "repeats": args.repeats,
            "torch": torch.__version__,
            "device": "cpu",
            "store": "local directory",
        },
        "results": results,
        "compare": {
            "save_speedup": before["save_s"] / after["save_s"],
            "load_speedup": before["load_s"] / after["load_s"],
            "save_peak_extra_MiB": [before["save_peak_extra_MiB"], after["save_peak_extra_MiB"]],
            "load_peak_extra_MiB": [before["load_peak_extra_MiB"], after["load_peak_extra_MiB"]],
        },
    }
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
