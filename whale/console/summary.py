"""The end of `whale run`: what a person needs next, instead of a JSON dump. Pure.

The evaluation table (each evaluation point: phase, cycle, step, after, harness, training rollouts spent
by then, mean@k; the best marked), the best point, the accepted harness and the last checkpoint as store
URIs, and the commands to look further (`whale report`, `whale status`, `whale logs`) or to go on
(`whale run ... --retry` after a failure, `whale run ...` after an interruption).
"""

from __future__ import annotations

import shlex

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from whale.core.status import RunPhase, WhaleRunStatus


def evaluation_table(status: WhaleRunStatus) -> Table:
    """Each evaluation point: phase (it names cycle and what it follows), step, harness, training rollouts
    spent by then, mean@k; the best marked with ``*``, an evaluation flagged for reward integrity ``FLAGGED``."""
    best = status.best.phase if status.best else None
    k = status.best.k if status.best else None
    table = Table(title="evaluations", title_justify="left")
    widest = max((len(e.phase) for e in status.evals), default=5)
    table.add_column("phase", no_wrap=True, min_width=widest)
    table.add_column("step", justify="right")
    table.add_column("harness", no_wrap=True)
    table.add_column("rollouts", justify="right", no_wrap=True)
    table.add_column(f"mean@{k or 'k'}", justify="right", no_wrap=True)
    for e in status.evals:
        mean = "-" if e.mean_at_k is None else f"{e.mean_at_k:.4f}" + (" *" if e.phase == best else "  ")
        if e.flagged:
            mean += " FLAGGED"
        table.add_row(
            e.phase,
            str(e.step),
            _harness(e.harness),
            f"{e.rollouts_at:,}",
            mean,
            style="bold" if e.phase == best else None,
        )
    return table


def _harness(key: str | None) -> str:
    return "h0" if key is None else key.rstrip("/").rsplit("/", 1)[-1].removesuffix(".py")


def next_commands(
    name: str, status: WhaleRunStatus, store_arg: str, run_command: str, prog: str = "whale"
) -> list[str]:
    """What to run next. ``store_arg`` is the store as the person gave it (a folder or s3://...);
    ``run_command`` the `whale run` command that resumes this run; ``prog`` whale as they invoked it."""
    store = shlex.quote(store_arg)
    run_path = shlex.quote(f"{store_arg.rstrip('/')}/runs/{name}")
    out = []
    if status.phase is RunPhase.FAILED:
        failed = sorted(status.failures, key=lambda p: status.failures[p], reverse=True)
        if failed:
            out.append(f"{prog} logs {name} --store {store} --phase {failed[0]}")
        out.append(f"{run_command} --retry")
    elif not status.phase.is_terminal():
        out.append(run_command)
    out.append(f"{prog} status {name} --store {store}")
    if status.evals:
        out.append(f"{prog} report {run_path}")
    return out


def final_summary(
    name: str,
    status: WhaleRunStatus,
    uri_for: dict[str, str],
    store_arg: str,
    run_command: str,
    elapsed: str,
    prog: str = "whale",
) -> RenderableType:
    """The end of a run. ``uri_for`` maps the store keys the status names (current harness and checkpoint)
    to their URIs; ``elapsed`` is this session's wall time, already worded."""
    rows: list[RenderableType] = []
    head = f"run {name} {status.phase.value} after {elapsed}"
    if status.message:
        head += f": {status.message}"
    rows.append(Text(head, style="bold"))
    if status.evals:
        rows.append(evaluation_table(status))
    lines = []
    if status.best is not None:
        b = status.best
        lines.append(
            f"best: mean@{b.k} {b.mean_at_k:.4f} at {b.phase} (step {b.step}, harness {_harness(b.harness)}, "
            f"{b.rollouts_at:,} training rollouts)"
        )
    lines.append(
        f"training rollouts: {status.rollouts_spent:,}; weight steps: {status.checkpoint_step}"
        + (f"/{status.total_steps}" if status.total_steps else "")
    )
    harness = status.current_harness
    lines.append(
        "accepted harness: " + (uri_for.get(harness, harness) if harness else "h0 (the domain's base harness)")
    )
    checkpoint = status.current_checkpoint
    lines.append(
        "checkpoint: " + (uri_for.get(checkpoint, checkpoint) if checkpoint else "the base model (no step trained)")
    )
    for flag in status.integrity_flags:
        what = "evaluation" if flag.evaluation else "ACCEPTED candidate" if flag.accepted else "candidate (refused)"
        reason = flag.reasons[0] if flag.reasons else "flagged"
        lines.append(f"reward integrity: {flag.phase} {what} {flag.candidate}: {reason}")
    rows.extend(Text(line) for line in lines)
    rows.append(Text("next:"))
    rows.extend(Text(f"  {command}") for command in next_commands(name, status, store_arg, run_command, prog))
    return Group(*rows)
