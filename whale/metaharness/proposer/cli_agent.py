"""External agent CLI proposer: a command template run in the scratch area with a timeout.

``spec.harnessSearch.proposer.command`` is an argv template; these fields are filled in:
``{scratch}`` (the working directory; candidates go to ``{scratch}/candidates/NAME.py`` with an
optional ``NAME.md`` rationale), ``{archive}`` (read-only copy of the archive), ``{skill}`` (the
domain's SKILL.md path), ``{prompt}`` (PROMPT.md: the task statement, also fed on stdin),
``{n}`` (how many candidates) and ``{iteration}``. Example, a coding-agent CLI in the search image::

    command: ["claude", "-p", "--dangerously-skip-permissions", "--add-dir", "{archive}",
              "Read {prompt} and do what it says."]

The agent is trusted software but its output is not: files are collected with size caps, every
failure (non-zero exit, timeout) is a note, and the iteration goes on. The process runs in its own
session and the whole group is killed at the deadline. Its environment is the parent's minus
anything that looks like a credential, plus ``extra_env`` (e.g. the agent's API key).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from whale.metaharness.proposer.base import ProposalRequest, Proposer, ProposerError, ProposerReport, collect_candidates, task_prompt
from whale.sandbox.policy import SECRET_NAME_RE

OUTPUT_TAIL_BYTES = 64_000
FIELDS = ("scratch", "archive", "skill", "prompt", "n", "iteration")


def render_command(template: list[str], values: Mapping[str, str]) -> list[str]:
    """Fill ``{field}``s of the argv template; an unknown field is a configuration error."""
    out = []
    for arg in template:
        try:
            out.append(arg.format_map(dict(values)))
        except KeyError as exc:
            raise ProposerError(
                f"proposer command argument {arg!r} uses unknown field {exc}; known: {', '.join('{' + f + '}' for f in FIELDS)}"
            ) from None
        except (ValueError, IndexError) as exc:
            raise ProposerError(f"proposer command argument {arg!r} is not a valid template: {exc}") from None
    return out


class CLIAgentProposer(Proposer):
    """Backend ``cli``."""

    backend = "cli"

    def __init__(self, command: list[str], extra_env: Mapping[str, str] | None = None):
        if not command:
            raise ProposerError("proposer backend 'cli' needs `command` (the agent CLI's argv template)")
        self.command = list(command)
        self.extra_env = dict(extra_env or {})

    async def propose(self, request: ProposalRequest) -> ProposerReport:
        report = ProposerReport(stopped_by="exit")
        scratch = Path(request.scratch_dir)
        scratch.mkdir(parents=True, exist_ok=True)
        prompt_path = scratch / "PROMPT.md"
        prompt = task_prompt(request)
        prompt_path.write_text(prompt, encoding="utf-8")
        skill_path = scratch / "SKILL.md"
        skill_path.write_text(request.skill, encoding="utf-8")
        argv = render_command(self.command, {
            "scratch": str(scratch), "archive": str(request.archive_dir), "skill": str(skill_path),
            "prompt": str(prompt_path), "n": str(request.count), "iteration": str(request.iteration),
        })
        env = {k: v for k, v in os.environ.items() if not SECRET_NAME_RE.search(k)}
        env.update(self.extra_env)
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=scratch, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            report.stopped_by = "error"
            report.notes.append(f"cannot start the proposer command {argv[0]!r}: {exc}")
            return report
        output = bytearray()

        async def pump() -> None:
            assert proc.stdin is not None and proc.stdout is not None  # noqa: S101 - created with PIPE
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(prompt.encode())
                await proc.stdin.drain()
                proc.stdin.close()
            while chunk := await proc.stdout.read(65536):
                output.extend(chunk)
                if len(output) > 2 * OUTPUT_TAIL_BYTES:
                    del output[: len(output) - OUTPUT_TAIL_BYTES]
            await proc.wait()

        try:
            await asyncio.wait_for(pump(), timeout=request.timeout_s)
        except TimeoutError:
            report.stopped_by = "timeout"
            report.notes.append(f"the proposer command ran past its {request.timeout_s:.0f} s timeout and was killed")
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        if report.stopped_by == "exit" and proc.returncode != 0:
            report.notes.append(f"the proposer command exited with status {proc.returncode}")
        report.seconds = time.monotonic() - started
        tail = bytes(output[-OUTPUT_TAIL_BYTES:]).decode("utf-8", errors="replace")
        report.transcript.append({"argv": argv, "returncode": proc.returncode, "output_tail": tail})
        report.proposals, notes = collect_candidates(scratch, request.count)
        report.notes.extend(notes)
        return report
