"""The per-call max_tokens clamp of the episode runner (pure) and the prompt upper bound it uses when
the client cannot count tokens."""

from __future__ import annotations

import pytest

from tests.fixtures.specs import flat
from whale.core.spec import WhaleRunSpec
from whale.harness.runner import MESSAGE_FRAMING_TOKENS, call_max_tokens, message_tokens_upper_bound
from whale.inference.base import SamplingParams


def clamp(sampling, generated=0, prompt=100, first=None, max_model_len=None):
    return call_max_tokens(
        sampling, generated=generated, prompt_tokens=prompt, first_prompt=first, max_model_len=max_model_len
    )


def test_the_least_limit_wins_and_is_named():
    s = SamplingParams(max_tokens=8129, episode_tokens=8129, episode_window=16384)
    assert clamp(s) == (8129, "maxResponseTokens")
    assert clamp(s, generated=8000) == (129, "episodeTokenBudget")
    # the window counts the prompt's growth since the first call: assistant + environment tokens
    assert clamp(s, generated=3000, prompt=100 + 12000, first=100) == (4384, "episodeWindowTokens")
    assert clamp(s, prompt=30000, first=30000, max_model_len=32768) == (2768, "maxModelLen")
    assert clamp(s, generated=8129)[0] == 0  # spent: the episode ends
    assert clamp(SamplingParams(max_tokens=50), generated=10**6) == (50, "maxResponseTokens")  # no budget


def test_a_chess_episode_can_no_longer_ask_for_nine_times_the_window():
    """The issue's case: maxResponseTokens per call, 9 calls; the budget caps their sum."""
    s = SamplingParams(max_tokens=16384, episode_tokens=8129, episode_window=16384)
    generated, asked = 0, []
    for _ in range(9):
        n, _ = clamp(s, generated=generated, prompt=2000 + generated, first=2000, max_model_len=32768)
        if n < 1:
            break
        asked.append(n)
        generated += n  # a model that never stops uses all it may
    assert asked == [8129] and generated == 8129


def test_sampling_from_the_spec_carries_the_episode_budget():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 1},
            "rsft": {"sampling": {"maxResponseTokens": 8129, "episodeTokenBudget": 8129, "episodeWindowTokens": 16384}},
        }
    )
    from whale.inference.factory import sampling_for

    s = sampling_for(spec)
    assert (s.max_tokens, s.episode_tokens, s.episode_window) == (8129, 8129, 16384)
    default = WhaleRunSpec.model_validate({"domain": "synthetic", "condition": "mh_only", "model": {"name": "m"}})
    assert (sampling_for(default).episode_tokens, sampling_for(default).episode_window) == (8192, None)
    with pytest.raises(ValueError, match="episodeTokenBudget"):
        WhaleRunSpec.model_validate({**flat(default.to_wire()), "rsft": {"sampling": {"episodeTokenBudget": 0}}})
    with pytest.raises(ValueError, match="episode_tokens"):
        SamplingParams(episode_tokens=0)


@pytest.mark.parametrize(
    "content",
    [
        "plain words and numbers 123 456",
        "unicode: Schach \u265e \u00e9l\u00e8ve \u4e2d\u6587 \U0001f600",
        "code:\n    def f(x):\n        return {x: [1, 2, 3]}\n",
        "special-token text <|im_end|><|im_start|><think></think>",
        "",
    ],
)
def test_the_prompt_upper_bound_is_never_below_the_real_count(content):
    from tests.fixtures.thinking import thinking_tokenizer

    tok = thinking_tokenizer()
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": content},
        {"role": "assistant", "content": content},
        {"role": "tool", "content": content},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    real = len(tok(text, add_special_tokens=False)["input_ids"])
    assert real <= message_tokens_upper_bound(messages)
    assert message_tokens_upper_bound([]) == 0
    assert message_tokens_upper_bound([{"role": "user", "content": ""}]) > MESSAGE_FRAMING_TOKENS
