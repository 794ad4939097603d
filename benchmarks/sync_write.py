"""Writing the serving checkpoint of one RSFT step: ``save_pretrained`` of the whole folder vs the slot writer (issue #17).

``VLLMReloadSync`` (``whale.rsft.sync``) used to delete its slot folder and write it whole each step
(``save_for_serving``: cast to bf16, ``model.save_pretrained(state_dict=...)``, which copies each tensor off
the device into pageable memory and serialises it, then the tokenizer and a rewritten config). It now writes
through ``ServingFolderWriter``: each slot folder whole at its first sync, then only the weights file,
``safetensors.torch.save_file`` of the cast state from a pinned host copy reused across steps, renamed into
place. This script times both on a Qwen3-layout model with random fp32 weights on the device there is (CUDA
if present), ``--syncs`` syncs each, interleaved (the order alternates each step, so a busy machine slows
both alike), alternating two slot folders per path as ``VLLMReloadSync`` does. Between steps the weights
are perturbed in place (untimed), so each sync writes new numbers. After the last step the two paths'
folders of that step are compared: the same file names, the same tensor names and bit-equal tensors.

Printed side by side: each path's median seconds, the new path's median over its weights-only syncs
(the steady state: all but the first two), and the ratio old / new. No server is involved (the reload is
measured by ``benchmarks/weight_sync_vllm.py``).

    PYTHONPATH=. python benchmarks/sync_write.py --json out.json                        # ~100 M parameters
    PYTHONPATH=. python benchmarks/sync_write.py --model qwen3-1.7b --json out.json     # the GPU
    PYTHONPATH=. python benchmarks/sync_write.py --smoke                                # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checkpoint_async import SHAPES, build_model, tokenizer  # the benchmarks' shared model and tokenizer

# the layer shape of the ~100 M default (checkpoint_async's 110 M shape); --params sets the depth
SMALL = {k: v for k, v in SHAPES["110m"].items() if k != "layers"}


def shape_for(params: float) -> dict[str, Any]:
    """The SMALL layer shape with as many layers as make about ``params`` parameters (tied embeddings)."""
    s = SMALL
    attn = s["hidden"] * s["head_dim"] * (2 * s["heads"] + 2 * s["kv"])
    per_layer = attn + 3 * s["hidden"] * s["inter"]
    layers = max(1, round((params - s["vocab"] * s["hidden"]) / per_layer))
    return {**s, "layers": layers}


def write_old(model: Any, tok: Any, folder: Path) -> None:
    """What VLLMReloadSync did before: the slot folder deleted and written whole by save_pretrained."""
    from whale.rsft.sync import save_for_serving

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    save_for_serving(model, tok, folder)


def same_folder(a: Path, b: Path) -> dict[str, Any]:
    from safetensors import safe_open

    files = sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    with safe_open(str(a / "model.safetensors"), "pt") as fa, safe_open(str(b / "model.safetensors"), "pt") as fb:
        names = set(fa.keys()) == set(fb.keys())
        tensors = names and all(torch.equal(fa.get_tensor(n), fb.get_tensor(n)) for n in fa.keys())  # noqa: SIM118
    return {"same_files": files, "same_tensor_names": names, "equal_tensors": tensors}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default=None, help="a fixed shape (default: --params)")
    parser.add_argument("--params", type=float, default=100e6, help="parameters of the Qwen3-layout model")
    parser.add_argument("--syncs", type=int, default=6, help="syncs per path (the new path's first two write whole)")
    parser.add_argument("--dir", type=Path, default=None, help="where the slot folders go (default: $TMPDIR)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 3 syncs (CPU smoke test)")
    parser.add_argument("--json", "--out", dest="out", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.syncs = "smoke", 3
    if args.syncs < 3:
        parser.error("--syncs: at least 3 (the new path writes each of its two slot folders whole first)")

    from whale.rsft.sync import ServingFolderWriter

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = SHAPES[args.model] if args.model else shape_for(args.params)
    model, tok = build_model(shape, device), tokenizer()
    params = sum(p.numel() for p in model.parameters())
    root = Path(tempfile.mkdtemp(prefix="whale-sync-write-", dir=args.dir))
    writer = ServingFolderWriter()
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    kinds: list[str] = []
    try:
        for step in range(args.syncs):
            with torch.no_grad():  # the next step's weights (untimed)
                for p in model.parameters():
                    p.add_(torch.randn_like(p), alpha=1e-3)
            slot = f"slot-{step % 2}"
            order = ("old", "new") if step % 2 == 0 else ("new", "old")
            for path in order:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                if path == "old":
                    write_old(model, tok, root / "old" / slot)
                else:
                    kinds.append(writer.write(model, tok, root / "new" / slot))
                seconds[path].append(time.perf_counter() - start)
            print(f"step {step}: old {seconds['old'][-1]:.3f} s, new {seconds['new'][-1]:.3f} s ({kinds[-1]})")
        last = f"slot-{(args.syncs - 1) % 2}"
        check = same_folder(root / "old" / last, root / "new" / last)
        weights_bytes = (root / "new" / last / "model.safetensors").stat().st_size
    finally:
        shutil.rmtree(root, ignore_errors=True)

    steady = [s for s, kind in zip(seconds["new"], kinds, strict=True) if kind == "weights"]
    old_median, new_median, steady_median = (statistics.median(v) for v in (seconds["old"], seconds["new"], steady))
    report = {
        "benchmark": "sync_write",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(),
        "shape": shape,
        "parameters": params,
        "weights_bytes": weights_bytes,
        "syncs": args.syncs,
        "old_s": seconds["old"],
        "new_s": seconds["new"],
        "new_kinds": kinds,
        "old_median_s": old_median,
        "new_median_s": new_median,
        "new_weights_only_median_s": steady_median,
        "ratio_old_over_new_weights_only": old_median / steady_median,
        "ratio_old_over_new_all": old_median / new_median,
        **check,
    }
    print(f"{params / 1e6:.0f} M parameters, {weights_bytes / 1e6:.0f} MB of bf16 weights, {args.syncs} syncs each")
    print(f"{'':28}{'old (save_pretrained)':>24}{'new (slot writer)':>20}{'old / new':>12}")
    print(f"{'median, all syncs (s)':28}{old_median:>24.3f}{new_median:>20.3f}{old_median / new_median:>12.2f}")
    print(f"{'median, weights-only (s)':28}{'':>24}{steady_median:>20.3f}{old_median / steady_median:>12.2f}")
    print(f"same files, tensor names, tensors: {check}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if not all(check.values()):
        raise SystemExit("the two paths wrote different folders")
    return report


if __name__ == "__main__":
    main()
