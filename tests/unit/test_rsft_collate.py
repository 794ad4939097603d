"""Chat-template masking: loss on the model's own tokens only, verified on token ids."""

from __future__ import annotations

import random

import pytest

from whale.rsft.collate import (
    IGNORE_INDEX,
    Example,
    TemplateMismatchError,
    bucket_length,
    collate_micro,
    encode_trajectories,
    encode_trajectory,
    micro_batches,
    minibatches,
    pack_collate,
    pad_collate,
    render_ids,
)
from whale.rsft.rejection import Trajectory

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok():
    from synthetic.tiny_model import build_tokenizer

    return build_tokenizer()


def labelled_text(tok, example: Example) -> list[str]:
    """The labelled spans of an example, decoded, one string per contiguous span."""
    spans, current = [], []
    for tid, lab in zip(example.input_ids, example.labels, strict=True):
        if lab != IGNORE_INDEX:
            assert lab == tid
            current.append(tid)
        elif current:
            spans.append(tok.decode(current))
            current = []
    if current:
        spans.append(tok.decode(current))
    return spans


def conversation(*turns: tuple[str, str]) -> tuple[dict[str, str], ...]:
    return tuple({"role": r, "content": c} for r, c in turns)


def test_only_the_assistant_reply_and_its_end_token_carry_loss(tok):
    msgs = conversation(
        ("system", "Answer inside <answer></answer>."),
        ("user", "Repeat the digit 7."),
        ("assistant", "<answer>7</answer>"),
    )
    [ex] = encode_trajectory(tok, Trajectory(0, msgs, 1.0))
    assert labelled_text(tok, ex) == ["<answer>7</answer><|im_end|>"]
    # the newline the template adds after <|im_end|> was never generated: not trained
    assert tok.decode(list(ex.input_ids)).endswith("<answer>7</answer><|im_end|>")
    prompt = tok.apply_chat_template(list(msgs[:2]), tokenize=False, add_generation_prompt=True)
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert all(lab == IGNORE_INDEX for lab in ex.labels[:n_prompt])
    assert ex.n_target == len(ex) - n_prompt


def test_multi_turn_keeps_every_assistant_turn_and_masks_tool_and_user_turns(tok):
    msgs = conversation(
        ("user", "q1"),
        ("assistant", "first"),
        ("tool", "tool says 42"),
        ("assistant", "second"),
        ("user", "trailing user text"),
    )
    [ex] = encode_trajectory(tok, Trajectory(0, msgs, 1.0))
    assert labelled_text(tok, ex) == ["first<|im_end|>", "second<|im_end|>"]
    assert "tool says 42" in tok.decode(list(ex.input_ids)) and "trailing" not in tok.decode(list(ex.input_ids))


class CountingTokenizer:
    """The tokenizer, counting chat-template renders and the texts of each tokenizer call."""

    def __init__(self, tok):
        self.tok, self.renders, self.calls = tok, 0, []
        self.eos_token_id, self.pad_token_id = tok.eos_token_id, tok.pad_token_id

    def apply_chat_template(self, conversation, **kwargs):
        self.renders += 1
        return self.tok.apply_chat_template(conversation, **kwargs)

    def __call__(self, text, **kwargs):
        self.calls.append(len(text) if isinstance(text, list) else 1)
        return self.tok(text, **kwargs)

    def convert_tokens_to_ids(self, *args, **kwargs):
        return self.tok.convert_tokens_to_ids(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_steps_trajectories_share_their_prompts_renders_and_encode_as_one_by_one(tok):
    prompt = conversation(("system", "Answer inside <answer></answer>."), ("user", "Repeat the digit 7."))
    other = conversation(("user", "Repeat the digit 3."))
    multi = conversation(("user", "q1"), ("assistant", "first"), ("tool", "tool says 42"), ("assistant", "second"))
    kept = [
        Trajectory(0, (*prompt, {"role": "assistant", "content": "<answer>7</answer>"}), 1.0, rollout=0),
        Trajectory(0, (*prompt, {"role": "assistant", "content": "<answer>7</answer> 7"}), 1.0, rollout=1),
        Trajectory(1, (*other, {"role": "assistant", "content": "<answer>3</answer>"}), 1.0),
        Trajectory(2, multi, 1.0),
    ]
    one_by_one = [e for t in kept for e in encode_trajectory(tok, t)]
    counting = CountingTokenizer(tok)
    assert encode_trajectories(counting, kept) == one_by_one
    # prompt 0's two rollouts: its context once + each reply's rendering (which is the whole conversation's
    # too); prompt 1: 2; the two-turn trajectory: 2 per turn. One by one it was 3 per single-turn trajectory
    # (prefix, turn, whole) and 5 for the two-turn one: 14
    assert counting.renders == 3 + 2 + 4
    # every render tokenised in one batched call (a fast tokenizer spreads it over the cores)
    assert counting.calls == [3 + 2 + 4]


HISTORY_REWRITING = (
    "{%- for m in messages %}{%- if m['role'] == 'assistant' and not loop.last %}"
    "{{- '<|im_start|>assistant\\n(earlier)<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_rewrites_history_still_gives_one_sequence_with_the_turns_as_generated(tok):
    original = tok.chat_template
    tok.chat_template = HISTORY_REWRITING
    try:
        msgs = conversation(("user", "q1"), ("assistant", "first"), ("user", "q2"), ("assistant", "second"))
        [one] = encode_trajectory(tok, Trajectory(0, msgs, 1.0))
        per_turn = encode_trajectory(tok, Trajectory(0, msgs, 1.0), sequences="turn")
    finally:
        tok.chat_template = original
    assert labelled_text(tok, one) == ["first<|im_end|>", "second<|im_end|>"]
    assert "(earlier)" not in tok.decode(list(one.input_ids))  # grown from the turns as generated (verl's way)
    # the option: one sequence per turn, turn 2 with the rewritten history it was sampled in
    assert [labelled_text(tok, e) for e in per_turn] == [["first<|im_end|>"], ["second<|im_end|>"]]
    assert "(earlier)" in tok.decode(list(per_turn[1].input_ids))


# the generation prompt opens a block the rendered turn does not have (like an empty think block)
PROMPT_NOT_A_PREFIX = HISTORY_REWRITING.replace(
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}", "{{- '<|im_start|>assistant\\nPLAN: ' }}{%- endif %}"
)


def test_when_the_prompt_is_not_a_prefix_the_turn_is_rebuilt_from_what_was_generated(tok):
    original = tok.chat_template
    tok.chat_template = PROMPT_NOT_A_PREFIX
    try:
        [ex] = encode_trajectory(
            tok, Trajectory(0, conversation(("user", "q"), ("assistant", "<answer>3</answer>")), 1.0)
        )
        assert tok.decode(list(ex.input_ids)).endswith("assistant\nPLAN: <answer>3</answer><|im_end|>")
        assert labelled_text(tok, ex) == ["<answer>3</answer><|im_end|>"]
        msgs = (
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        )
        with pytest.raises(TemplateMismatchError, match="message 1"):
            encode_trajectory(tok, Trajectory(3, msgs, 1.0))
    finally:
        tok.chat_template = original


def test_no_assistant_message_means_nothing_to_train(tok):
    assert encode_trajectory(tok, Trajectory(0, conversation(("user", "q")), 1.0)) == []


def test_truncation_keeps_the_start():
    ex = Example(tuple(range(10)), (IGNORE_INDEX,) * 5 + tuple(range(5, 10)))
    from whale.rsft.collate import _truncate

    assert _truncate(ex, 7).input_ids == tuple(range(7)) and _truncate(ex, 7).n_target == 2


def test_padding_and_packing_carry_no_loss_on_padding_or_across_boundaries():
    a = Example((1, 2, 3), (IGNORE_INDEX, 2, 3))
    b = Example((4, 5), (4, 5))  # a first token labelled: packing must still drop it
    padded = pad_collate([a, b], pad_id=0)
    assert padded["input_ids"] == [[1, 2, 3], [4, 5, 0]]
    assert padded["labels"][1] == [4, 5, IGNORE_INDEX] and padded["attention_mask"][1] == [1, 1, 0]
    packed = pack_collate([a, b])
    assert packed["input_ids"] == [[1, 2, 3, 4, 5]] and packed["position_ids"] == [[0, 1, 2, 0, 1]]
    assert packed["labels"] == [[IGNORE_INDEX, 2, 3, IGNORE_INDEX, 5]]


def test_minibatches_are_a_seeded_partition_and_micro_batches_split_them():
    examples = [Example((i,) * (i + 1), (i,) * (i + 1)) for i in range(10)]
    mbs = minibatches(examples, 4, random.Random(1))
    assert [len(m) for m in mbs] == [4, 4, 2]
    assert sorted(e.input_ids[0] for m in mbs for e in m) == list(range(10))
    assert mbs == minibatches(examples, 4, random.Random(1))
    micro = micro_batches(mbs[0], 3)
    assert [len(m) for m in micro] == [3, 1] and len(micro[0][0]) >= len(micro[0][-1])


def test_bucket_widths_cover_every_length_with_few_shapes_and_bounded_padding():
    widths = {n: bucket_length(n) for n in range(1, 4097)}
    assert all(w >= n for n, w in widths.items())
    # 256..4096 is four doublings: floor plus two rungs each = 9 shapes, not one per length
    assert sorted(set(widths.values())) == [256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    assert all(w < 1.5 * n + 1 for n, w in widths.items() if n > 256)  # padding under half a rung
    assert len({bucket_length(n, per_octave=4) for n in range(1, 4097)}) == 17
    with pytest.raises(ValueError, match="power of two"):
        bucket_length(300, per_octave=3)
    assert bucket_length(4000, cap=3900) == 4096 and bucket_length(3100, cap=3500) == 3500  # cap = longest allowed


def test_micro_batch_collation_modes():
    a, b = Example((1, 2, 3), (IGNORE_INDEX, 2, 3)), Example((4, 5), (4, 5))
    masked = collate_micro([a, b], 0, padding="masked")
    assert masked == pad_collate([a, b], 0) and "attention_mask" in masked
    longest = collate_micro([a, b], 0, padding="longest")
    assert "attention_mask" not in longest and longest["input_ids"] == masked["input_ids"]
    bucket = collate_micro([a, b], 0, padding="bucket")
    assert "attention_mask" not in bucket and [len(r) for r in bucket["input_ids"]] == [256, 256]
    assert bucket["labels"][1] == [4, 5] + [IGNORE_INDEX] * 254
    assert collate_micro([a, b], 0, padding="longest", pack=True) == pack_collate([a, b])
    # packed + bucket: the one row is padded to the bucket of its total (a sequence of its own)
    assert collate_micro([a, b], 0, padding="bucket", pack=True) == pack_collate([a, b], 0, width=256)
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_collate([a], 0, width=2)


def test_growing_a_sequence_turn_by_turn_rebuilds_the_whole_rendering_where_the_template_keeps_history(tok):
    """The trajectory sequence of a history-rewriting template is grown as verl's loops grow it (each reply,
    the template's end of turn, the messages between rendered on their own); on a template that keeps history
    that growth must give exactly the rendering of the whole conversation, tool messages and tools included."""
    from whale.rsft.collate import _grown  # the growth path on its own (the public path merges here)

    msgs = (
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "What is 3 + 14?"},
        {"role": "assistant", "content": "call", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "17"},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "<answer>17</answer>"},
    )
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    trajectory = Trajectory(0, msgs, 1.0, tools=tools)
    [merged] = encode_trajectory(tok, trajectory)
    kw = {"tools": tools, "template_kwargs": {}}
    turns, after, positions = [], [], []
    for i in (2, 5):
        prefix = render_ids(tok, msgs[:i], add_generation_prompt=True, **kw)
        full = render_ids(tok, msgs[: i + 1], add_generation_prompt=False, **kw)
        end = next(j for j in range(len(full) - 1, -1, -1) if full[j] == tok.eos_token_id) + 1
        turns.append((prefix, full[len(prefix) : end]))
        after.append(full[end:])
        positions.append(i)
    assert _grown(tok, list(msgs), turns, after, positions, kw, None) == merged
