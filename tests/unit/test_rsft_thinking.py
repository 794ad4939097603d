"""Thinking through RSFT's collate path, with a Qwen3.5-style thinking template (tests.fixtures.thinking).

The paper's rule (verl's agent loops): the loss falls on every token the model generated, thinking
included, and the training sequence is the context generation saw plus the generated tokens. So:
a reply's reasoning, ``</think>`` and answer carry loss, the ``<think>`` the prompt opened does not;
inside a tool-call chain the earlier turns' thinking stays in the one sequence (generation saw it);
after a new user message the template drops it, and the trajectory is still one sequence (the reference's),
the earlier thinking kept; ``sequences="turn"`` makes each turn train on the context it was sampled in.
"""

from __future__ import annotations

import pytest

from tests.unit.test_rsft_collate import labelled_text
from whale.rsft.collate import IGNORE_INDEX, encode_trajectory
from whale.rsft.rejection import Trajectory

pytest.importorskip("tokenizers")

THINKING_ON = {"enable_thinking": True}


@pytest.fixture(scope="module")
def tok():
    from tests.fixtures.thinking import thinking_tokenizer

    return thinking_tokenizer()


def reply(reasoning: str, answer: str) -> dict[str, str]:
    """An assistant message as the model generated it after the prompt's ``<think>\\n`` (Qwen3.5 style;
    vLLM without a reasoning parser and the in-process backend both give it so)."""
    return {"role": "assistant", "content": f"{reasoning}\n</think>\n\n{answer}"}


def test_the_thinking_of_a_reply_carries_loss_and_the_prompts_think_does_not(tok):
    msgs = ({"role": "user", "content": "What is 3 + 14?"}, reply("three plus fourteen", "<answer>17</answer>"))
    [ex] = encode_trajectory(tok, Trajectory(0, msgs, 1.0, template_kwargs=THINKING_ON))
    assert labelled_text(tok, ex) == ["three plus fourteen\n</think>\n\n<answer>17</answer><|im_end|>"]
    text = tok.decode(list(ex.input_ids))
    assert text.endswith("assistant\n<think>\nthree plus fourteen\n</think>\n\n<answer>17</answer><|im_end|>")
    think_open = tok.convert_tokens_to_ids("<think>")
    assert [lab for tid, lab in zip(ex.input_ids, ex.labels, strict=True) if tid == think_open] == [IGNORE_INDEX]


def test_a_tool_call_chain_is_one_sequence_with_every_turns_thinking_in_context_and_loss(tok):
    msgs = (
        {"role": "user", "content": "Solve it."},
        reply("first I compute", "call 1"),
        {"role": "tool", "content": "42"},
        reply("the tool says 42", "<answer>42</answer>"),
    )
    [ex] = encode_trajectory(tok, Trajectory(0, msgs, 1.0, template_kwargs=THINKING_ON))
    assert labelled_text(tok, ex) == [
        "first I compute\n</think>\n\ncall 1<|im_end|>",
        "the tool says 42\n</think>\n\n<answer>42</answer><|im_end|>",
    ]
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(list(ex.input_ids))


CHESS = (
    {"role": "user", "content": "Move?"},
    reply("e4 is best", "<move>e2e4</move>"),
    {"role": "user", "content": "Opponent played e5. Move?"},
    reply("develop the knight", "<move>g1f3</move>"),
)


def test_after_a_new_user_message_the_trajectory_is_still_one_sequence_with_the_loss_on_model_turns(tok):
    """The reference's verl trains one sequence per trajectory: the first turn's context, each reply as generated,
    and between them the template's end of turn plus the next user message with the generation prompt."""
    [ex] = encode_trajectory(tok, Trajectory(0, CHESS, 1.0, template_kwargs=THINKING_ON))
    assert labelled_text(tok, ex) == [
        "e4 is best\n</think>\n\n<move>e2e4</move><|im_end|>",
        "develop the knight\n</think>\n\n<move>g1f3</move><|im_end|>",
    ]
    # as rendered for the first turn, then grown: turn 1's thinking stays in the sequence (unlike the template's
    # re-rendering), the user message between carries no loss
    first_turn = tok.apply_chat_template(list(CHESS[:2]), tokenize=False, **THINKING_ON)
    between = tok.apply_chat_template([CHESS[2]], tokenize=False, add_generation_prompt=True, **THINKING_ON)
    text = tok.decode(list(ex.input_ids))
    assert text == first_turn + between + "develop the knight\n</think>\n\n<move>g1f3</move><|im_end|>"
    # sequences="turn" trains the same tokens of the model, in two sequences
    split = encode_trajectory(tok, Trajectory(0, CHESS, 1.0, template_kwargs=THINKING_ON), sequences="turn")
    assert len(split) == 2 and sum(e.n_target for e in split) == ex.n_target


def test_a_template_that_keeps_history_gives_the_same_one_sequence_either_way(tok):
    msgs = (
        {"role": "user", "content": "Solve it."},
        reply("first I compute", "call 1"),
        {"role": "tool", "content": "42"},
        reply("the tool says 42", "<answer>42</answer>"),
    )
    trajectory = Trajectory(0, msgs, 1.0, template_kwargs=THINKING_ON)
    assert encode_trajectory(tok, trajectory) == encode_trajectory(tok, trajectory, sequences="turn")


def test_with_sequences_turn_each_turn_trains_on_the_context_it_was_sampled_in(tok):
    msgs = CHESS
    first, second = encode_trajectory(tok, Trajectory(0, msgs, 1.0, template_kwargs=THINKING_ON), sequences="turn")
    assert labelled_text(tok, first) == ["e4 is best\n</think>\n\n<move>e2e4</move><|im_end|>"]
    assert labelled_text(tok, second) == ["develop the knight\n</think>\n\n<move>g1f3</move><|im_end|>"]
    context = tok.decode(list(second.input_ids))
    # generation of turn 2 saw turn 1 without its thinking (the template drops it): so does training
    assert "e4 is best" not in context and "<move>e2e4</move>" in context
    rendered = tok.apply_chat_template(list(msgs[:3]), tokenize=False, add_generation_prompt=True, **THINKING_ON)
    assert context.startswith(rendered)


def test_thinking_off_keeps_the_empty_think_block_in_the_prompt_and_trains_the_answer(tok):
    msgs = ({"role": "user", "content": "What is 3 + 14?"}, {"role": "assistant", "content": "<answer>17</answer>"})
    [ex] = encode_trajectory(tok, Trajectory(0, msgs, 1.0, template_kwargs={"enable_thinking": False}))
    assert labelled_text(tok, ex) == ["<answer>17</answer><|im_end|>"]
    assert "<think>\n\n</think>\n\n<answer>17</answer>" in tok.decode(list(ex.input_ids))


def test_reasoning_content_from_a_reasoning_parser_trains_the_same_tokens(tok):
    """With vLLM's reasoning parser on, the thinking comes apart (``reasoning_content``); the template
    puts it back where generation had it, so the training sequence is the same."""
    inline = ({"role": "user", "content": "q"}, reply("think", "<answer>1</answer>"))
    split = (
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<answer>1</answer>", "reasoning_content": "think"},
    )
    a = encode_trajectory(tok, Trajectory(0, inline, 1.0, template_kwargs=THINKING_ON))
    b = encode_trajectory(tok, Trajectory(0, split, 1.0, template_kwargs=THINKING_ON))
    assert a == b and labelled_text(tok, a[0])[0].startswith("think\n</think>")
