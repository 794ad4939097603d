"""Replay proposer: candidates recorded in a script file (backend ``replay``; CI and demos).

The script is JSON: ``{"iterations": {"2": [{"name": ..., "code": ... | "file": ..., "rationale": ...}],
"3": [...]}}``. ``file`` paths are relative to the script. An iteration with no entry proposes
nothing. No model, no network: it exists so a whole WHALE run can be exercised deterministically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from whale.metaharness.proposer.base import Proposal, ProposalRequest, Proposer, ProposerError, ProposerReport


class ReplayProposer(Proposer):
    backend = "replay"

    def __init__(self, script: str | Path):
        self.path = Path(script)
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ProposerError(
                f"replay script {self.path} does not exist (spec.experiment.harnessSearch.proposer.script)"
            ) from None
        except ValueError as exc:
            raise ProposerError(f"replay script {self.path} is not valid JSON: {exc}") from None
        except OSError as exc:
            raise ProposerError(f"replay script {self.path}: cannot read it: {exc.strerror or exc}") from None
        except RecursionError:
            raise ProposerError(f"replay script {self.path} is nested too deeply to read") from None
        iterations = data.get("iterations") if isinstance(data, dict) else None
        if not isinstance(iterations, dict):
            raise ProposerError(f'replay script {self.path}: expected {{"iterations": {{"2": [...]}}}}')
        self.iterations: dict[int, list[dict[str, Any]]] = {int(k): list(v) for k, v in iterations.items()}

    async def propose(self, request: ProposalRequest) -> ProposerReport:
        report = ProposerReport(stopped_by="finish")
        for entry in self.iterations.get(request.iteration, [])[: request.count]:
            if "file" in entry:
                code = (self.path.parent / entry["file"]).read_text(encoding="utf-8")
            else:
                code = str(entry.get("code", ""))
            report.proposals.append(Proposal(str(entry.get("name", "replay")), code, str(entry.get("rationale", ""))))
        if not report.proposals:
            report.notes.append(f"the replay script has no candidates for iteration {request.iteration}")
        return report
