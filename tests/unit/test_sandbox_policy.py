"""Pure sandbox policy: outcome classification, environment allow-list, limit validation."""

import signal

import pytest

from whale.sandbox.policy import (
    BASE_ENV,
    Isolation,
    Limits,
    Outcome,
    build_env,
    classify,
    last_exception,
)

TRACEBACK_MEM = 'Traceback (most recent call last):\n  File "main.py", line 1\nMemoryError\n'
TRACEBACK_VALUE = 'Traceback (most recent call last):\n  File "main.py", line 3\nValueError: bad input\n'


@pytest.mark.parametrize(
    ("kwargs", "outcome", "error_type"),
    [
        ({"returncode": 0}, Outcome.OK, None),
        ({"returncode": 1, "stderr_tail": TRACEBACK_VALUE}, Outcome.ERROR, "ValueError"),
        ({"returncode": 1, "stderr_tail": TRACEBACK_MEM}, Outcome.MEMORY_LIMIT, "MemoryError"),
        ({"returncode": -signal.SIGXCPU}, Outcome.CPU_LIMIT, "SIGXCPU"),
        ({"returncode": -signal.SIGXFSZ}, Outcome.FILE_SIZE_LIMIT, "SIGXFSZ"),
        ({"returncode": -signal.SIGSEGV}, Outcome.KILLED, "SIGSEGV"),
        ({"returncode": -signal.SIGKILL, "timed_out": True}, Outcome.TIMEOUT, None),
        ({"returncode": -signal.SIGKILL, "output_overflow": True, "timed_out": True}, Outcome.OUTPUT_LIMIT, None),
        ({"returncode": None, "setup_error": "unshare failed"}, Outcome.SANDBOX_ERROR, None),
        ({"returncode": None}, Outcome.KILLED, None),
    ],
)
def test_classify(kwargs, outcome, error_type):
    assert classify(**kwargs) == (outcome, error_type)


def test_limit_outcomes_are_marked():
    assert Outcome.TIMEOUT.is_limit and Outcome.MEMORY_LIMIT.is_limit
    assert not Outcome.ERROR.is_limit and not Outcome.OK.is_limit
    assert Outcome.OK.ok and not Outcome.KILLED.ok


def test_last_exception_reads_the_final_traceback_line():
    assert last_exception(TRACEBACK_VALUE) == ("ValueError", "bad input")
    assert last_exception("nothing here") == (None, None)


def test_build_env_is_an_allow_list():
    parent = {"OPENAI_API_KEY": "sk-x", "AWS_SECRET_ACCESS_KEY": "y", "TZ": "UTC", "HOME": "/root", "FOO": "1"}
    env = build_env("/scratch", parent, ["TZ", "FOO", "OPENAI_API_KEY"], {"EXTRA": "2"})
    assert env["HOME"] == env["TMPDIR"] == "/scratch"
    assert env["TZ"] == "UTC" and env["FOO"] == "1" and env["EXTRA"] == "2"
    assert "OPENAI_API_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert set(env) == set(BASE_ENV) | {"HOME", "TMPDIR", "TZ", "FOO", "EXTRA"}


def test_isolation_refuses_forwarding_credentials():
    with pytest.raises(ValueError, match="credential-like variables.*HF_TOKEN"):
        Isolation(pass_env=("TZ", "HF_TOKEN"))


def test_limits_validate_and_map_to_rlimits():
    with pytest.raises(ValueError, match="Limits.memory_bytes"):
        Limits(memory_bytes=0)
    with pytest.raises(ValueError, match="Limits.wall_s"):
        Limits(wall_s=0)
    rl = Limits(cpu_s=5, memory_bytes=100, file_size_bytes=10, processes=3, open_files=20).rlimits()
    assert rl == {
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_CPU": (5, 6),
        "RLIMIT_AS": (100, 100),
        "RLIMIT_FSIZE": (10, 10),
        "RLIMIT_NPROC": (3, 3),
        "RLIMIT_NOFILE": (20, 20),
    }
    assert "RLIMIT_CPU" not in Limits(cpu_s=None).rlimits()
