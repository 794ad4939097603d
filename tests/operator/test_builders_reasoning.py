"""vLLM's reasoning parser in the inference pod's args: only when the spec names one and thinking is on."""

from __future__ import annotations

import pytest

from tests.operator.test_builders import make_spec
from whale_operator import builders

BASE = [
    "/models/current",
    "--served-model-name",
    "Qwen/Qwen3.5-2B",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--tensor-parallel-size",
    "1",
    "--max-model-len",
    "32768",
    "--gpu-memory-utilization",
    "0.9",
    "--max-num-seqs",
    "64",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "qwen3_coder",
]


@pytest.mark.parametrize(
    "parser,thinking,extra",
    [
        (None, True, []),  # the paper: thinking inline in content, no parser
        ("qwen3", True, ["--reasoning-parser", "qwen3"]),
        ("qwen3", False, []),  # thinking off: nothing to parse out
    ],
)
def test_reasoning_parser_args(parser, thinking, extra):
    spec = make_spec(
        inference={"reasoningParser": parser}, model={"name": "Qwen/Qwen3.5-2B", "enableThinking": thinking}
    )
    assert builders.vllm_args(spec) == BASE + extra
    pod = builders.inference_deployment(builders.RunRef("demo", "team-a", "uid-1"), spec, store_uri="s3://whale")[
        "spec"
    ]["template"]["spec"]
    assert pod["containers"][0]["args"] == BASE + extra
