"""Every attack of the report (issue #12, harness side) as a harness file run through the real runtime:
``run_episodes`` / ``HarnessPool`` with the synthetic or math domain and a scripted model, the harness
process started through the real ``whale.sandbox``. Each test fails if the attack succeeds.

The probe files skip the static gate on purpose (the gate is tested first, then the file is run as one
that slipped past it would run): what stops them here is the process sandbox and the worker's audit
hook together. ``test_harness_audit_hook.py`` shows the hook alone; ``test_harness_gold.py`` shows that
no gold answer is ever sent to the process in the first place.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from math_reasoning import MathReasoning
from synthetic import DOMAIN as SYNTHETIC
from tests.security.harness_probes import (
    CHECKOUT,
    FAKE_SECRET,
    attack_attempts,
    gold_file,
    probe_harness,
    probe_source,
    report,
    run_probe_in_child,
)
from whale.harness import launch
from whale.harness.launch import IsolationUnavailableError, SandboxLimits
from whale.harness.process import HarnessPool, HarnessProcess
from whale.harness.runner import run_episodes
from whale.harness.validate import HarnessValidationError, validate_source
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient
from whale.tools.code import CodeLimits, LocalCodeRunner

ITEM = {"id": "probe-0", "digit": 3, "answer": "3"}


async def run_probe(path: Path, limits: SandboxLimits | None = None) -> tuple[dict[str, str], str]:
    """Run one synthetic episode under the probe harness; (its report, the whole trace as JSON)."""
    episodes = await run_episodes(
        SYNTHETIC, path, ScriptedClient(["<answer>3</answer>"]), [ITEM], SamplingParams(), limits=limits, processes=1
    )
    episode = episodes[0]
    assert episode.error is None, episode.error
    return report(episode.messages[0]["content"]), episode.to_json()


def test_the_random_os_route_is_rejected_by_the_gate(tmp_path: Path) -> None:
    source = probe_source('return Decision(messages=[{"role": "user", "content": repr(os.getcwd())}])\n')
    with pytest.raises(HarnessValidationError) as info:
        validate_source(source, SYNTHETIC.allowed_imports | {"socket"})
    assert "[private-attribute] attribute _os is private" in str(info.value)


def test_every_way_in_is_contained_at_runtime(tmp_path: Path, listener) -> None:
    port, connected = listener
    gold, row = gold_file()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "verifier.py").write_text("def score(): return 0.0\n")
    attempts = attack_attempts(gold, outside, port)
    secrets = {"WHALE_PROBE_API_KEY": FAKE_SECRET, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET}

    got = run_probe_in_child(probe_harness(tmp_path, attempts), secrets)

    # what the attacks go for is there: the gold file is readable here, the secret in the runtime's environ
    assert row["problem"][:30] in gold.read_text(encoding="utf-8")
    assert FAKE_SECRET in got["runtime_environ"]
    assert got["error"] is None, got["error"]
    results = report(got["content"])
    assert set(results) == set(attempts)
    leaked = {
        name: outcome
        for name, outcome in results.items()
        if not outcome.startswith("BLOCKED") and name != "its own environ"
    }
    assert leaked == {}
    assert results["its own environ"].startswith("OK: {") and "PATH" in results["its own environ"]
    assert row["problem"][:30] not in got["trace"] and FAKE_SECRET not in got["trace"]
    assert not connected()
    assert not (outside / "created.txt").exists()
    assert (outside / "verifier.py").read_text() == "def score(): return 0.0\n"


def test_a_hub_token_in_the_runtimes_environment_never_reaches_the_harness(tmp_path: Path) -> None:
    """HF_TOKEN (a gated model's token: spec.experiment.model.hfTokenSecret on a cluster, the environment of `whale run` here)
    is in the runtime that downloads the model; the harness it starts sees neither the variable nor its value."""
    attempts = {
        "HF_TOKEN": "os.environ.get('HF_TOKEN')",
        "the value under any name": f"[k for k, v in os.environ.items() if v == {FAKE_SECRET!r}]",
    }
    got = run_probe_in_child(probe_harness(tmp_path, attempts), {"HF_TOKEN": FAKE_SECRET})
    assert f"HF_TOKEN={FAKE_SECRET}" in got["runtime_environ"] and got["error"] is None, got["error"]
    assert report(got["content"]) == {"HF_TOKEN": "OK: None", "the value under any name": "OK: []"}
    assert FAKE_SECRET not in got["trace"]


async def test_inside_only_the_staged_package_and_the_stdlib_are_importable(tmp_path: Path) -> None:
    path = probe_harness(
        tmp_path,
        {
            "sys.path": "__import__('sys').path",
            "whale": "__import__('whale').__file__",
            "whale.harness": "__import__('whale.harness').harness.__file__",
        },
    )
    results, _ = await run_probe(path)
    sys_path = eval(results["sys.path"].removeprefix("OK: "))  # noqa: S307 - our own repr of a list of str
    package = Path(sys_path[0])
    assert results["whale"] == f"OK: {str(package / 'whale' / '__init__.py')!r}"
    assert str(CHECKOUT) not in results["sys.path"] and "site-packages" not in results["sys.path"]
    assert all(p == sys_path[0] or p.startswith(os.path.realpath(sys.base_prefix)) for p in sys_path)


async def test_a_reward_hack_that_answers_from_gold_scores_zero(tmp_path: Path) -> None:
    gold, row = gold_file()
    path = tmp_path / "hack.py"
    path.write_text(
        textwrap.dedent(f"""\
        import json
        import random
        from whale.harness.api import BaseHarness, Decision, env_action

        GOLD = {str(gold)!r}


        def answer_for(item_id):
            os = random._os
            readers = [
                lambda: os.open(GOLD.encode(), os.O_RDONLY),
                lambda: os.open(GOLD, os.O_RDONLY),
                lambda: os.open("/proc/self/root" + GOLD, os.O_RDONLY),
            ]
            for reader in readers:
                try:
                    fd = reader()
                    data = b""
                    while chunk := os.read(fd, 65536):
                        data += chunk
                except BaseException:
                    continue
                for line in data.decode().splitlines():
                    row = json.loads(line)
                    if str(row["id"]) == item_id:
                        return str(row["answer"])
            return None


        class Harness(BaseHarness):
            MAX_TURNS = 1

            def start(self, task, state):
                answer = answer_for(task["id"])
                if answer is not None:
                    return Decision(actions=[env_action("\\\\boxed{{" + answer + "}}")])
                return Decision(messages=[{{"role": "user", "content": task["problem"]}}])
        """)
    )
    domain = MathReasoning(runner=LocalCodeRunner(CodeLimits(timeout_s=5)))
    # without the walls the hack works: the answer it looks for is in the file, and it would score 1
    env = domain.make_env(row)
    env.reset()
    env.step("\\boxed{" + row["answer"] + "}")
    assert env.reward() == 1.0
    episodes = await run_episodes(
        domain, path, ScriptedClient(["I do not know."]), [row], SamplingParams(), processes=1
    )
    assert episodes[0].error is None and episodes[0].turns == 1
    assert episodes[0].reward == 0.0


def test_the_local_backend_cannot_be_selected(tmp_path: Path) -> None:
    path = tmp_path / "h.py"
    path.write_text("from whale.harness.api import BaseHarness\nclass Harness(BaseHarness):\n    pass\n")
    for removed in ("_spawn_local", "worker_argv", "spawn", "network_isolated"):
        assert not hasattr(launch, removed), removed
    assert list(inspect.signature(launch.spawn_worker).parameters) == ["harness_path", "allowed_imports", "limits"]
    with pytest.raises(TypeError):
        HarnessProcess(path, {"re"}, backend="local")  # type: ignore[call-arg]  # the removed option, on purpose
    with pytest.raises(TypeError):
        HarnessPool(path, {"re"}, backend="local")  # type: ignore[call-arg]  # the removed option, on purpose
    with pytest.raises(ValueError, match="isolation must be one of"):
        SandboxLimits(isolation="local")  # type: ignore[arg-type]  # an invalid value, on purpose


# ----- fail closed: the kernel refuses namespaces for real ---------------------------------------------

#: runs in a child process: a seccomp filter makes unshare(2) fail with EPERM for it and everything it
#: starts (a real refusal by the kernel, not an injected fake), then starts a harness pool
_NO_NAMESPACES = r"""
import asyncio, ctypes, json, platform, sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
ALLOW, EPERM = 0x7FFF0000, 0x00050000 | 1
ARCH, UNSHARE = {"x86_64": (0xC000003E, 272), "aarch64": (0xC00000B7, 97)}[platform.machine()]


class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]


rules = [(0x20, 0, 0, 4), (0x15, 1, 0, ARCH), (0x06, 0, 0, ALLOW),      # other ABIs: allow
         (0x20, 0, 0, 0), (0x15, 0, 1, UNSHARE), (0x06, 0, 0, EPERM),    # unshare: EPERM
         (0x06, 0, 0, ALLOW)]
filters = (Filter * len(rules))(*[Filter(*r) for r in rules])
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
assert libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(rules), filters)), 0, 0) == 0
refused = libc.unshare(0x40000000) == -1 and ctypes.get_errno() == 1  # CLONE_NEWNET

from whale.harness.process import HarnessPool
from whale.harness.launch import SandboxLimits


async def main():
    pool = HarnessPool(sys.argv[2], {"re"}, SandboxLimits(isolation=sys.argv[1]), processes=1)
    try:
        await pool.start()
        decision, _ = await pool.call("start", {"task": {"prompt": "hello"}}, {})
        return {"started": True, "isolation": pool.isolation, "content": decision["messages"][0]["content"]}
    except Exception as exc:
        return {"started": False, "type": type(exc).__name__, "message": str(exc)}
    finally:
        await pool.aclose()


print(json.dumps({"refused": refused, **asyncio.run(main())}))
"""


def start_without_namespaces(tmp_path: Path, isolation: str) -> dict:
    harness = tmp_path / "plain.py"
    harness.write_text(
        "from whale.harness.api import BaseHarness\nclass Harness(BaseHarness):\n    USER_TEMPLATE = 'got {prompt}'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", _NO_NAMESPACES, isolation, str(harness)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=CHECKOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_namespaces_the_pool_fails_closed_naming_the_spec_field(tmp_path: Path) -> None:
    result = start_without_namespaces(tmp_path, "namespaces")
    assert result["refused"] is True  # the kernel really refuses namespaces in that process
    assert result["started"] is False and result["type"] == IsolationUnavailableError.__name__
    assert result["message"].startswith("kernel isolation is unavailable here: ")
    assert "set spec.execution.sandbox.isolation: none only for trusted local use" in result["message"]


def test_isolation_none_runs_there_and_says_it_is_not_isolated(tmp_path: Path) -> None:
    result = start_without_namespaces(tmp_path, "none")
    assert result["refused"] is True
    assert result["started"] is True and result["content"] == "got hello"
    assert result["isolation"]["level"] == "none"  # NOT isolated: runs as the caller, in its namespaces


def test_isolation_none_warns_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(launch, "_warned_none", [])
    with caplog.at_level("WARNING", logger="whale.harness.launch"):
        for _ in range(3):
            launch.warn_if_unisolated("none")
        launch.warn_if_unisolated("namespaces")
    warnings = [r for r in caplog.records if "WITHOUT kernel isolation" in r.getMessage()]
    assert len(warnings) == 1


async def test_the_isolation_is_reported_by_the_pool(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text("from whale.harness.api import BaseHarness\nclass Harness(BaseHarness):\n    pass\n")
    async with HarnessPool(path, {"re"}, processes=1) as pool:
        isolation = pool.isolation
    assert isolation["level"] == "namespaces" and isolation["processes"] == 1
    if "network" in isolation:  # the launcher's own report (its keys are the launcher's business)
        assert str(isolation["network"]).startswith("netns")
