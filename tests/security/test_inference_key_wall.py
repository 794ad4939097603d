"""The run's vLLM API key (``$WHALE_INFERENCE_API_KEY`` in the worker pod) never reaches harness code: the sandbox's
environment is an allow-list, and the key's name cannot be put on it. The attack: a candidate harness reads the
key from its environment to call the run's vLLM admin endpoints itself."""

from __future__ import annotations

import pytest

from whale.inference.vllm_control import API_KEY_ENV
from whale.sandbox import Isolation, Outcome, run_python

KEY = "vllm-key-of-the-run-9c41e2"

READ_ENV = """
import os
print(repr(dict(os.environ)))
print(os.environ.get("WHALE_INFERENCE_API_KEY"))
"""


def test_harness_code_cannot_read_the_runs_vllm_key(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    r = run_python(READ_ENV)
    assert r.outcome is Outcome.OK, r.stderr
    assert KEY not in r.stdout and KEY not in r.stderr
    assert r.stdout.strip().splitlines()[-1] == "None"


def test_the_key_cannot_be_forwarded_by_name():
    with pytest.raises(ValueError, match="credential-like"):
        Isolation(pass_env=(API_KEY_ENV,))
