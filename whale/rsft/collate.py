"""Trajectories -> token sequences with a loss mask, and sequences -> (micro-)batches.

The loss falls on the tokens the model generated and nothing else. To know which tokens those are,
each assistant turn is rendered the way generation saw it: the chat template applied to the
messages before the turn with the generation prompt (``prefix``), and to the messages up to and
including the turn (``full``). The turn's tokens are ``full[len(prefix):]``, cut after the end-of-turn
token (the model stopped there; the template's trailing newline was never generated). That
``prefix`` really is a prefix of ``full`` is *checked on the token ids*, not assumed.

A multi-turn trace is one training sequence, as the reference trains (verl's agent loops: one sequence per
trajectory, the loss on the model's turns only). When every turn's ``prefix + turn`` is a prefix of the
rendering of the whole conversation (ChatML-style templates) that rendering is the sequence. Templates that
rewrite history (Qwen3-style templates drop earlier turns' thinking before a new user message, as in chess)
fail that check; the sequence is then built the way verl's loops grow it: the first turn's context, each
turn's generated tokens, and between two turns the template's end of the turn plus the messages that came
between, rendered on their own with the generation prompt (verl's tool-response delta). Earlier turns keep
their thinking in it, as in the reference, although generation of a later turn did not see it.
``rsft.sequences: turn`` (an option) instead makes each turn of such a trace its own sequence with exactly the
context generation saw. System, user and tool tokens never carry loss. Pure apart from the tokenizer it is
given.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from whale.rsft.rejection import Trajectory

IGNORE_INDEX = -100


class ChatTokenizer(Protocol):
    """The part of a transformers tokenizer this module uses."""

    eos_token_id: int | None
    pad_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: str | list[str], **kwargs: Any) -> Any: ...


#: how a multi-turn trace whose template rewrites history is trained: one sequence (the reference's) or one per turn
Sequences = Literal["trajectory", "turn"]


class TemplateMismatchError(ValueError):
    """The chat template renders a turn's context differently once the turn is added, and the turn
    cannot be rebuilt from its raw text (it holds tool calls)."""


@dataclass(frozen=True)
class Example:
    """One training sequence: ``labels[t]`` is ``input_ids[t]`` where the token carries loss, else -100."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]

    @property
    def n_target(self) -> int:
        """Tokens that carry loss (the first token never does: nothing predicts it)."""
        return sum(1 for t in self.labels[1:] if t != IGNORE_INDEX)

    def __len__(self) -> int:
        return len(self.input_ids)


#: renders already made in one :func:`encode_trajectories` call: (messages, tools, kwargs, generation prompt) as
#: JSON -> token ids. A step's rollouts of one prompt share every context up to their first reply.
RenderCache = dict[str, list[int]]


def render_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any],
    cache: RenderCache | None = None,
) -> list[int]:
    """The chat template's text, tokenised the way an OpenAI-compatible server tokenises a rendered
    prompt (no extra special tokens: the template already placed them). ``cache``: renders to reuse (the
    same arguments render the same ids); the ids returned are then shared, not to be changed."""
    render = _Render(messages, tools, add_generation_prompt, template_kwargs)
    key = None if cache is None else render.key()
    if cache is None or key is None:  # no cache, or a value JSON cannot hold: render it without the cache
        return render.ids(tokenizer)
    if key not in cache:
        cache[key] = render.ids(tokenizer)
    return cache[key]


@dataclass(frozen=True)
class _Render:
    """The arguments of one chat-template rendering."""

    messages: Sequence[dict[str, Any]]
    tools: Sequence[dict[str, Any]] | None
    add_generation_prompt: bool
    template_kwargs: dict[str, Any]

    def key(self) -> str | None:
        """The arguments as JSON (a :data:`RenderCache` key); None when a value is not JSON."""
        try:
            return json.dumps(
                [self.messages, self.tools, self.template_kwargs, self.add_generation_prompt], sort_keys=True
            )
        except (TypeError, ValueError):
            return None

    def text(self, tokenizer: ChatTokenizer) -> str:
        return str(
            tokenizer.apply_chat_template(
                [dict(m) for m in self.messages],
                tools=list(self.tools) if self.tools else None,
                tokenize=False,
                add_generation_prompt=self.add_generation_prompt,
                **self.template_kwargs,
            )
        )

    def ids(self, tokenizer: ChatTokenizer) -> list[int]:
        return list(tokenizer(self.text(tokenizer), add_special_tokens=False)["input_ids"])


def prerender(tokenizer: ChatTokenizer, trajectories: Iterable[Trajectory], cache: RenderCache) -> None:
    """Put into ``cache`` every render the trajectories' encoding will ask for (each assistant turn's context
    and the conversation up to that turn), the texts tokenised in one batched call: a fast tokenizer encodes
    a batch on all cores, where one text at a time is one core's work (most of a step's encoding)."""
    texts: dict[str, str] = {}
    for trajectory in trajectories:
        messages = list(trajectory.messages)
        for i, msg in enumerate(messages):
            if msg.get("role") != "assistant":
                continue
            for upto, generation_prompt in ((i, True), (i + 1, False)):
                render = _Render(messages[:upto], trajectory.tools, generation_prompt, trajectory.template_kwargs)
                key = render.key()
                if key is not None and key not in cache and key not in texts:
                    texts[key] = render.text(tokenizer)
    if texts:
        batch = tokenizer(list(texts.values()), add_special_tokens=False)["input_ids"]
        cache.update(zip(texts, (list(ids) for ids in batch), strict=True))


def _cut_after_stop(turn: list[int], stop_ids: frozenset[int]) -> list[int]:
    for i in range(len(turn) - 1, -1, -1):
        if turn[i] in stop_ids:
            return turn[: i + 1]
    return turn


def stop_token_ids(tokenizer: ChatTokenizer, extra: Iterable[int] = ()) -> frozenset[int]:
    """End-of-turn ids: the tokenizer's eos plus e.g. the generation config's eos list."""
    ids = {int(i) for i in extra}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def encode_trajectory(
    tokenizer: ChatTokenizer,
    trajectory: Trajectory,
    *,
    stop_ids: frozenset[int] | None = None,
    max_length: int | None = None,
    cache: RenderCache | None = None,
    sequences: Sequences = "trajectory",
) -> list[Example]:
    """The training sequences of one trajectory: one, or with ``sequences="turn"`` one per assistant turn when
    the template rewrites history (see module doc). ``cache``: renders shared with the other trajectories of
    one call (:func:`encode_trajectories`)."""
    messages = list(trajectory.messages)
    stops = stop_ids if stop_ids is not None else stop_token_ids(tokenizer)
    kw: dict[str, Any] = {"tools": trajectory.tools, "template_kwargs": trajectory.template_kwargs}
    turns: list[tuple[list[int], list[int]]] = []  # (context ids, generated ids) per assistant turn
    after: list[list[int]] = []  # per assistant turn: what the template renders after its generated tokens
    positions: list[int] = []  # per assistant turn: its message index
    whole: list[int] | None = None  # the rendering up to the last assistant turn: that turn's ``full``
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        # contexts repeat across a prompt's rollouts (the cache); a turn with its reply is in the cache when
        # :func:`prerender` tokenised the step's renders together
        prefix = render_ids(tokenizer, messages[:i], add_generation_prompt=True, cache=cache, **kw)
        full = whole = render_ids(tokenizer, messages[: i + 1], add_generation_prompt=False, cache=cache, **kw)
        if full[: len(prefix)] == prefix and len(full) > len(prefix):
            generated = _cut_after_stop(full[len(prefix) :], stops)
        elif msg.get("tool_calls"):
            raise TemplateMismatchError(
                f"prompt {trajectory.prompt_index}, message {i}: the chat template renders the context of this "
                "assistant turn differently once the turn is appended, and the turn holds tool calls, so its "
                "generated text cannot be rebuilt; use a template whose generation prompt is a prefix of the "
                "rendered turn"
            )
        else:
            # Rebuild the turn from its raw text: exactly what the model emitted after ``prefix``.
            content = msg.get("content") or ""
            generated = list(tokenizer(content, add_special_tokens=False)["input_ids"])
            if tokenizer.eos_token_id is not None:
                generated.append(int(tokenizer.eos_token_id))
        turns.append((prefix, generated))
        positions.append(i)
        end = len(prefix) + len(generated)
        after.append(full[end:] if full[len(prefix) : end] == generated else [])
    if whole is None:  # no assistant turn
        return []
    merged = _merge(turns, whole)
    if merged is None and sequences == "trajectory":
        merged = _grown(tokenizer, messages, turns, after, positions, kw, cache)
    examples = (
        [merged]
        if merged is not None
        else [Example(tuple(p + g), tuple([IGNORE_INDEX] * len(p) + g)) for p, g in turns]
    )
    return [_truncate(e, max_length) for e in examples]


def _template_preamble(tokenizer: ChatTokenizer, kw: dict[str, Any], cache: RenderCache | None) -> list[int]:
    """What the template puts before any message of its own accord (a default system prompt; often nothing):
    one user message rendered, less what a second one adds (verl's ``initialize_system_prompt``)."""
    user = {"role": "user", "content": ""}
    one = render_ids(
        tokenizer, [user], add_generation_prompt=False, tools=None, template_kwargs=kw["template_kwargs"], cache=cache
    )
    two = render_ids(
        tokenizer,
        [user, user],
        add_generation_prompt=False,
        tools=None,
        template_kwargs=kw["template_kwargs"],
        cache=cache,
    )
    return one[: len(one) - (len(two) - len(one))]


def _grown(
    tokenizer: ChatTokenizer,
    messages: list[dict[str, Any]],
    turns: list[tuple[list[int], list[int]]],
    after: list[list[int]],
    positions: list[int],
    kw: dict[str, Any],
    cache: RenderCache | None,
) -> Example | None:
    """One sequence grown turn by turn as verl's agent loops grow it (module doc); None when the template cannot
    render the messages between two turns on their own (then each turn is its own sequence)."""
    first_context, first_generated = turns[0]
    ids = list(first_context) + list(first_generated)
    labels = [IGNORE_INDEX] * len(first_context) + list(first_generated)
    try:
        preamble = _template_preamble(tokenizer, kw, cache)
        for k in range(1, len(turns)):
            between = messages[positions[k - 1] + 1 : positions[k]]
            if not between:
                return None
            rendered = render_ids(
                tokenizer,
                between,
                add_generation_prompt=True,
                tools=None,
                template_kwargs=kw["template_kwargs"],
                cache=cache,
            )
            if rendered[: len(preamble)] != preamble:
                return None
            context = list(after[k - 1]) + rendered[len(preamble) :]
            generated = turns[k][1]
            ids += context + list(generated)
            labels += [IGNORE_INDEX] * len(context) + list(generated)
    except Exception:  # noqa: BLE001  # a template that refuses these messages alone (jinja raises anything)
        return None
    return Example(tuple(ids), tuple(labels))


def encode_trajectories(
    tokenizer: ChatTokenizer,
    trajectories: Iterable[Trajectory],
    *,
    stop_ids: frozenset[int] | None = None,
    max_length: int | None = None,
    sequences: Sequences = "trajectory",
) -> list[Example]:
    """The training sequences of a step's kept trajectories, in order (``sequences``: :func:`encode_trajectory`). The contexts they share (a prompt's
    rollouts: the same messages up to the first reply) are rendered and tokenised once, and all the step's
    renders are tokenised together (:func:`prerender`)."""
    trajectories = list(trajectories)
    stops = stop_ids if stop_ids is not None else stop_token_ids(tokenizer)
    cache: RenderCache = {}
    prerender(tokenizer, trajectories, cache)
    out: list[Example] = []
    for trajectory in trajectories:
        out.extend(
            encode_trajectory(
                tokenizer, trajectory, stop_ids=stops, max_length=max_length, cache=cache, sequences=sequences
            )
        )
    return out


def _merge(turns: list[tuple[list[int], list[int]]], whole: list[int]) -> Example | None:
    """One sequence with every turn labelled, if each ``context + turn`` is a prefix of ``whole``."""
    labels = [IGNORE_INDEX] * len(whole)
    end = 0
    for prefix, generated in turns:
        stop = len(prefix) + len(generated)
        if len(prefix) < end or whole[: len(prefix)] != prefix or whole[len(prefix) : stop] != generated:
            return None
        labels[len(prefix) : stop] = generated
        end = stop
    ids = whole[:end]
    return Example(tuple(ids), tuple(labels[:end]))


def _truncate(example: Example, max_length: int | None) -> Example:
    if max_length is None or len(example) <= max_length:
        return example
    return Example(example.input_ids[:max_length], example.labels[:max_length])


# ----- batching -----------------------------------------------------------------------------------


def minibatches(examples: Sequence[Example], size: int, rng: random.Random) -> list[list[Example]]:
    """Shuffle (seeded) and cut into minibatches of ``size`` (the last one may be smaller)."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    return [[examples[i] for i in order[j : j + size]] for j in range(0, len(order), size)]


def update_groups(
    examples: Sequence[Example], mini_batch_size: int, ranks: int, scope: str, rng: random.Random
) -> list[tuple[list[Example], ...]]:
    """One SFT epoch's optimiser updates: for each update, every rank's share of it (``shares[rank]``).

    The sequences are shuffled (seeded) once. ``perRank`` (the paper's verl): rank r takes every
    ranks-th sequence, then cuts its share into minibatches of ``mini_batch_size``; update j is every
    rank's j-th minibatch. ``global``: minibatches of ``mini_batch_size`` over all sequences, each shared
    out over the ranks. How many updates: :func:`whale.core.batching.optimizer_updates` (an empty share
    means a rank sits that update out with no sequence, as verl's padding rows carry no loss)."""
    from whale.core.batching import optimizer_updates

    order = list(range(len(examples)))
    rng.shuffle(order)
    ordered = [examples[i] for i in order]
    n = optimizer_updates(len(ordered), ranks=ranks, mini_batch_size=mini_batch_size, sft_epochs=1, scope=scope)  # type: ignore[arg-type]  # a MiniBatchScope value, checked by the spec
    size = mini_batch_size
    if scope == "perRank":
        shares = [ordered[r::ranks] for r in range(ranks)]
        return [tuple(share[j * size : (j + 1) * size] for share in shares) for j in range(n)]
    return [tuple(ordered[j * size : (j + 1) * size][r::ranks] for r in range(ranks)) for j in range(n)]


def micro_batches(minibatch: Sequence[Example], size: int, *, row_tokens: int | None = None) -> list[list[Example]]:
    """Cut a minibatch into micro-batches of ``size`` sequences, longest first, so each micro-batch
    pads little. The minibatch is one token-mean update, so the order inside it changes nothing.

    ``row_tokens`` (``rsft.packTokens``): micro-batches of up to that many tokens instead, for packed rows of
    one fixed size; first fit, longest first (each sequence goes to the first micro-batch it fits in), so
    the rows are nearly full and the number of sequences per micro-batch varies. A sequence longer than
    ``row_tokens`` takes a row of its own, as wide as it is: ``row_tokens`` bounds the memory of ordinary rows
    (it is a memory knob, not a cap on sequence length), and an outlier costs what it would cost unpacked."""
    ordered = sorted(minibatch, key=len, reverse=True)
    if row_tokens is None:
        return [list(ordered[j : j + size]) for j in range(0, len(ordered), size)]
    bins: list[list[Example]] = []
    room: list[int] = []
    for example in ordered:
        if len(example) > row_tokens:
            bins.append([example])
            room.append(0)
            continue
        slot = next((i for i, free in enumerate(room) if free >= len(example)), None)
        if slot is None:
            bins.append([])
            room.append(row_tokens)
            slot = len(bins) - 1
        bins[slot].append(example)
        room[slot] -= len(example)
    return bins


#: how a padded micro-batch is shaped; "masked" is the pre-bucketing behaviour, kept as an opt-out
Padding = Literal["bucket", "longest", "masked"]


def bucket_length(n: int, *, per_octave: int = 2, floor: int = 256, cap: int | None = None) -> int:
    """The smallest width >= ``n`` on a fixed ladder: ``floor``, then ``per_octave`` even steps per
    doubling (256, 384, 512, 768, 1024, ...), at most ``cap`` when ``n`` fits in it. A compiled layer
    sees one shape per rung instead of one per micro-batch, at a bounded padding cost (< 1/per_octave).
    ``per_octave`` is a power of two, so every rung is a multiple of ``floor / per_octave``."""
    if per_octave < 1 or per_octave & (per_octave - 1):
        raise ValueError(f"buckets per octave must be a power of two, not {per_octave}")
    width = floor
    while width < n:
        octave = 1 << (width.bit_length() - 1)  # the power of two at or below width
        width += max(1, octave // per_octave)
    return min(width, cap) if cap is not None and n <= cap else width


def pad_collate(
    batch: Sequence[Example], pad_id: int, *, width: int | None = None, attention_mask: bool = True
) -> dict[str, list[list[int]]]:
    """Right-padded rectangle of ``width`` (default: the longest sequence): input_ids, labels
    (padding carries no loss) and, if asked, attention_mask.

    Without the mask the model attends causally over the padding; that is exact for every real
    token (right padding comes after all of them) and keeps SDPA on its flash kernel."""
    longest = max(len(e) for e in batch)
    width = longest if width is None else width
    if width < longest:
        raise ValueError(f"pad width {width} is shorter than the longest sequence ({longest})")
    ids, mask, labels = [], [], []
    for e in batch:
        pad = width - len(e)
        ids.append(list(e.input_ids) + [pad_id] * pad)
        mask.append([1] * len(e) + [0] * pad)
        labels.append(list(e.labels) + [IGNORE_INDEX] * pad)
    out = {"input_ids": ids, "labels": labels}
    if attention_mask:
        out["attention_mask"] = mask
    return out


def collate_micro(
    batch: Sequence[Example],
    pad_id: int,
    *,
    padding: Padding,
    pack: bool = False,
    max_len: int | None = None,
    per_octave: int = 2,
    multiple_of: int = 1,
    row_tokens: int | None = None,
) -> dict[str, list[list[int]]]:
    """One micro-batch as the trainers feed it: packed, or right-padded per ``padding``
    ("bucket": to :func:`bucket_length`, no mask; "longest": no mask; "masked": with the mask).

    Packed: one row of every sequence; with "bucket" its width is the bucket of the total (a compiled
    layer sees few shapes), at most ``row_tokens`` (``rsft.packTokens``: rows filled up to it by
    :func:`micro_batches` mostly land on that one width), and it is rounded up to ``multiple_of`` (flex
    attention's block edge)."""
    if pack:
        total = sum(len(e) for e in batch)
        packed = bucket_length(total, per_octave=per_octave) if padding == "bucket" else total
        if row_tokens is not None:
            packed = min(packed, max(row_tokens, total))
        return pack_collate(batch, pad_id, width=-(-packed // multiple_of) * multiple_of)
    if padding == "masked":
        return pad_collate(batch, pad_id)
    longest = max(len(e) for e in batch)
    width = bucket_length(longest, per_octave=per_octave, cap=max_len) if padding == "bucket" else None
    return pad_collate(batch, pad_id, width=width, attention_mask=False)


def pack_collate(batch: Sequence[Example], pad_id: int = 0, *, width: int | None = None) -> dict[str, list[list[int]]]:
    """Sequences concatenated into one row with restarting position ids, right-padded to ``width``.

    The model must treat a position-id reset as a document boundary: :mod:`whale.rsft.attention`'s
    document mask (flex), transformers' own detection of restarted position ids (sdpa: a dense mask;
    flash: varlen). The first token of every sequence gets no label, so no loss crosses a boundary. The
    padding is one more sequence (positions from 0, no labels), so no real token attends to it."""
    ids: list[int] = []
    pos: list[int] = []
    labels: list[int] = []
    for e in batch:
        ids.extend(e.input_ids)
        pos.extend(range(len(e)))
        labels.append(IGNORE_INDEX)
        labels.extend(e.labels[1:])
    pad = (len(ids) if width is None else width) - len(ids)
    if pad < 0:
        raise ValueError(f"pack width {width} is shorter than the packed sequences ({len(ids)} tokens)")
    ids.extend([pad_id] * pad)
    pos.extend(range(pad))
    labels.extend([IGNORE_INDEX] * pad)
    return {"input_ids": [ids], "position_ids": [pos], "labels": [labels]}
