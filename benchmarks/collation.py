"""A step's collation on the CPU: the kept trajectories rendered and tokenised, one by one and as a step.

The RSFT step turns its kept trajectories into token sequences (``whale.rsft.collate``) before SFT; on the
H200 this was 0.46-0.5 s of a 27.9 s long-reply step (benchmarks/rsft_step.py). The synthetic domain's step
there kept ~178 of 96 prompts x 8 rollouts, each reply ~330 tokens; this script builds such a step (the
synthetic tokenizer, ``--prompts`` prompts with ``--kept`` rollouts kept each, replies of ``--reply-tokens``)
and times

* one by one: ``encode_trajectory`` per trajectory, no render shared (each renders its context and its turn);
* shared renders, tokenised one text at a time: ``encode_trajectory`` per trajectory with one render cache
  for the step (the weight phase's path before its renders were tokenised together);
* as a step: ``encode_trajectories``, which the weight phase calls: a prompt's rollouts render their shared
  context once, and every text of the step is tokenised in one batched call (``prerender``: a fast
  tokenizer spreads a batch over the cores);

side by side in one run, interleaved (each repeat times all three, in a rotating order), checking they give the
same sequences, and counting the chat-template renders and the tokenizer calls.

    PYTHONPATH=.:domains .venv/bin/python benchmarks/collation.py [--repeats 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent / "domains", HERE.parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from whale.rsft.collate import RenderCache, encode_trajectories, encode_trajectory, stop_token_ids  # noqa: E402
from whale.rsft.rejection import Trajectory  # noqa: E402


class CountingTokenizer:
    """The tokenizer, counting chat-template renders and tokenizer calls."""

    def __init__(self, tok: Any):
        self.tok, self.renders, self.calls = tok, 0, 0
        self.eos_token_id, self.pad_token_id = tok.eos_token_id, tok.pad_token_id

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.renders += 1
        return self.tok.apply_chat_template(conversation, **kwargs)

    def __call__(self, text: str | list[str], **kwargs: Any) -> Any:
        self.calls += 1
        return self.tok(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)


def step_trajectories(prompts: int, kept: int, reply_tokens: int) -> list[Trajectory]:
    out = []
    for p in range(prompts):
        digit = str(p % 10)
        context = (
            {"role": "system", "content": "Copy the digit. Answer inside <answer></answer>."},
            {"role": "user", "content": f"Item {p}: repeat the digit {digit}."},
        )
        for r in range(kept):
            reply = f"<answer>{digit}</answer>" + digit * reply_tokens + f" (rollout {r})"  # rollouts differ
            out.append(Trajectory(p, (*context, {"role": "assistant", "content": reply}), 1.0, rollout=r))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--kept", type=int, default=2, help="kept rollouts per prompt")
    parser.add_argument("--reply-tokens", type=int, default=330)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = parser.parse_args(argv)
    for name in ("prompts", "kept", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    from synthetic.tiny_model import build_tokenizer

    tok = build_tokenizer()
    stops = stop_token_ids(tok)
    kept = step_trajectories(args.prompts, args.kept, args.reply_tokens)

    def one_by_one(t: Any) -> list[Any]:
        return [e for tr in kept for e in encode_trajectory(t, tr, stop_ids=stops)]

    def shared_renders(t: Any) -> list[Any]:
        cache: RenderCache = {}
        return [e for tr in kept for e in encode_trajectory(t, tr, stop_ids=stops, cache=cache)]

    def as_a_step(t: Any) -> list[Any]:
        return encode_trajectories(t, kept, stop_ids=stops)

    rows: dict[str, Any] = {}
    results = {}
    paths = (("one by one", one_by_one), ("shared renders", shared_renders), ("as a step", as_a_step))
    counted = {}
    for name, fn in paths:
        counting = CountingTokenizer(tok)
        results[name] = fn(counting)
        counted[name] = counting
    # interleaved: each repeat times every path once, in an order rotated by one each time, so a machine whose load
    # changes (a shared one) weighs on all of them alike, not on whichever ran while it was busy
    times: dict[str, list[float]] = {name: [] for name, _ in paths}
    for repeat in range(args.repeats):
        for name, fn in paths[repeat % len(paths) :] + paths[: repeat % len(paths)]:
            start = time.perf_counter()
            fn(tok)
            times[name].append(time.perf_counter() - start)
    for name, _ in paths:
        rows[name] = {
            "median_s": statistics.median(times[name]),
            "all_s": times[name],
            "renders": counted[name].renders,
            "tokenizer_calls": counted[name].calls,
        }
    same = results["one by one"] == results["shared renders"] == results["as a step"]
    ratio = rows["one by one"]["median_s"] / rows["as a step"]["median_s"]
    batched = rows["shared renders"]["median_s"] / rows["as a step"]["median_s"]
    tokens = sum(len(e) for e in results["as a step"])
    print(
        f"{len(kept)} trajectories ({args.prompts} prompts x {args.kept} kept, {tokens:,} tokens), "
        f"median of {args.repeats}, {os.cpu_count()} CPUs"
    )
    for name, row in rows.items():
        print(
            f"  {name:<14} {row['median_s']:.3f} s  {row['renders']:>4} renders  "
            f"{row['tokenizer_calls']:>4} tokenizer calls"
        )
    print(f"  one by one / as a step: {ratio:.2f}x; shared renders / as a step (batched tokenising): {batched:.2f}x")
    print(f"  same sequences: {same}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"args": vars(args) | {"json": str(args.json)}, "trajectories": len(kept), "tokens": tokens}
        report |= {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "interleaved": True}
        report |= {"rows": rows, "ratio": ratio, "batched_ratio": batched, "same": same}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
