"""The operator process's settings (its environment, read once at start-up): each duration a finite number of seconds,
each count a whole number within its bounds. A bad value is refused naming the variable and what to give, and the
operator stops at start-up saying so, rather than running with a resync that never comes (``inf``), a daemon that
never waits (``0``, ``nan``) or kopf retrying its start-up every minute."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fixtures.kube import EmulatedCluster
from whale_operator.config import DaemonTimings, OperatorConfig, whole_setting

TIMINGS = {
    "WHALE_OPERATOR_RESYNC_S": "resync_s",
    "WHALE_OPERATOR_PROGRESS_S": "progress_s",
    "WHALE_OPERATOR_ERROR_BACKOFF_S": "error_backoff_s",
    "WHALE_OPERATOR_MAX_BACKOFF_S": "max_backoff_s",
}


def test_the_daemons_timings_are_the_defaults_or_what_the_environment_says() -> None:
    assert OperatorConfig.from_env({}).timings == DaemonTimings(30.0, 15.0, 5.0, 300.0)
    env = dict(zip(TIMINGS, ("60", "2.5", "1", "90"), strict=True))
    assert OperatorConfig.from_env(env).timings == DaemonTimings(60.0, 2.5, 1.0, 90.0)
    assert OperatorConfig.from_env({"WHALE_OPERATOR_RESYNC_S": " "}).timings.resync_s == 30.0  # empty: the default


@pytest.mark.parametrize("var", sorted(TIMINGS))
@pytest.mark.parametrize("bad", ["0", "-5", "soon", "inf", "nan", "1e400"])
def test_a_bad_timing_is_refused_naming_the_variable(var: str, bad: str) -> None:
    default = getattr(DaemonTimings(), TIMINGS[var])
    with pytest.raises(ValueError) as refused:
        OperatorConfig.from_env({var: bad})
    assert str(refused.value) == f"{var}={bad!r}: give a number of seconds, above 0 ({default:g} when unset)"


@pytest.mark.parametrize("bad", ["-1", "70000", "http", "80.0"])
def test_a_whole_number_setting_keeps_to_its_bounds(bad: str) -> None:
    assert whole_setting({}, "WHALE_OPERATOR_METRICS_PORT", 8080, 0, 65535) == 8080
    assert whole_setting({"WHALE_OPERATOR_METRICS_PORT": "0"}, "WHALE_OPERATOR_METRICS_PORT", 8080, 0, 65535) == 0
    with pytest.raises(ValueError, match=r"WHALE_OPERATOR_METRICS_PORT='.*': give a whole number from 0 to 65535"):
        whole_setting({"WHALE_OPERATOR_METRICS_PORT": bad}, "WHALE_OPERATOR_METRICS_PORT", 8080, 0, 65535)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("var", "bad"), [("WHALE_OPERATOR_RESYNC_S", "nan"), ("WHALE_OPERATOR_PEERING_LIFETIME_S", "a minute")]
)
def test_the_operator_stops_at_start_up_naming_a_bad_setting(
    operator_env: None, kube_cluster: EmulatedCluster, kube_namespace: str, var: str, bad: str
) -> None:
    """The real operator process (``kopf run``), as its Deployment starts it: it exits, not retrying, and its log
    names the variable."""
    env = {**os.environ, var: bad}
    args = [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", kube_namespace]
    done = subprocess.run(
        [*args, "-m", "whale_operator.handlers"], env=env, capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode != 0
    assert f"the operator's settings: {var}={bad!r}: give a" in done.stdout + done.stderr
