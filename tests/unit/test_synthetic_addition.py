"""synthetic's addition task (``spec.experiment.domainOptions.syntheticTask: addition``, docs/local.md#a-harder-task-make-compare-addition): the item
generator, the scorer, the variant's own h0 and skill, the local comparison's manifests and candidate harnesses.
The default task stays ``repeat`` (the demo and the tiny model depend on it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthetic import tasks
from whale import plugins
from whale.core.spec import Data
from whale.domain import DomainError
from whale.harness.provenance import normalise, occurs
from whale.harness.validate import validate_file
from whale.manifest import ManifestError, load_manifest
from whale.replay import replay_domain

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "manifests/examples/local"
ADDITION_MANIFESTS = sorted(LOCAL.glob("smollm2-addition-*.yaml"))
ADDITION = Data(harness_size=16)
REPEAT = plugins.load("synthetic")  # the default task
DOMAIN = REPEAT.with_options({"syntheticTask": "addition"})


def test_addition_items_are_sums_of_two_digits_drawn_from_the_seed() -> None:
    items = tasks.make_split("test", 200, seed=42, task=tasks.Task.ADDITION)
    low, high = tasks.ADDITION_OPERANDS
    assert all(low <= it["a"] <= high and low <= it["b"] <= high for it in items)
    assert all(it["answer"] == str(it["a"] + it["b"]) for it in items)
    assert [it["id"] for it in items] == [f"test-{i:05d}" for i in range(200)]
    # deterministic in (split, index, seed), different across seeds and splits, and not one repeated sum
    assert items == tasks.make_split("test", 200, seed=42, task=tasks.Task.ADDITION)
    assert items != tasks.make_split("test", 200, seed=43, task=tasks.Task.ADDITION)
    assert items != tasks.make_split("harness", 200, seed=42, task=tasks.Task.ADDITION)
    assert len({it["answer"] for it in items}) > 10


def test_the_default_task_is_still_repeat() -> None:
    assert REPEAT.options.synthetic_task == tasks.Task.REPEAT
    assert REPEAT.load_split("test", Data(test_size=3)) == tasks.make_split("test", 3, 42)
    assert all("digit" in it and "a" not in it for it in REPEAT.load_split("test", Data(test_size=5)))
    assert REPEAT.h0_path_for(Data()) == REPEAT.h0_path()


def test_an_addition_episode_asks_the_sum_and_scores_the_last_tag() -> None:
    item = DOMAIN.load_split("test", ADDITION)[0]
    env = DOMAIN.make_env(item)
    observation = env.reset()
    assert observation["question"] == f"What is {item['a']} + {item['b']}?"
    assert (observation["a"], observation["b"]) == (item["a"], item["b"])
    right, wrong = str(item["a"] + item["b"]), str(item["a"] + item["b"] + 1)
    cases = {
        f"<answer>{right}</answer>": 1.0,
        f"<answer>{wrong}</answer> <answer>{right}</answer>": 1.0,
        f"<answer>{right}</answer> <answer>{wrong}</answer>": 0.0,
        f"{item['a']} + {item['b']} = {right}.": 0.0,  # the verifier reads the tag only
    }
    for reply, reward in cases.items():
        env = DOMAIN.make_env(item)
        env.reset()
        env.step(reply)
        assert env.reward() == reward, reply


def test_the_addition_task_has_its_own_h0_and_skill() -> None:
    h0 = DOMAIN.h0_path_for(ADDITION)
    assert h0.name == "h0_addition.py" and h0 != DOMAIN.h0_path()
    validate_file(h0, DOMAIN.allowed_imports)
    source = h0.read_text()
    assert "<answer>50</answer>" in source and "add 20 and 30" in source  # its worked reply is a right sum
    skill = DOMAIN.skill_text(ADDITION)
    assert "What is 3 + 5?" in skill and skill != REPEAT.skill_text(Data())


def test_raw_addition_items_for_replay() -> None:
    assert DOMAIN.item_from_raw({"a": 3, "b": "5"}) == {"id": "raw-3+5", "a": 3, "b": 5, "answer": "8"}
    for bad in ({"a": 3}, {"a": "x", "b": 1}, {"a": -1, "b": 2}):
        with pytest.raises(DomainError, match="'a' and 'b'"):
            DOMAIN.item_from_raw(bad)


def test_an_unknown_task_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="spec.experiment.domainOptions.syntheticTask: .*'repeat' or 'addition'"):
        DOMAIN.with_options({"syntheticTask": "subtraction"})


@pytest.mark.parametrize("path", ADDITION_MANIFESTS, ids=lambda p: p.stem)
def test_the_addition_manifests_validate(path: Path) -> None:
    manifest = load_manifest(path)
    assert manifest.spec.experiment.domain_options == {"syntheticTask": "addition"}
    assert manifest.name == path.stem


def test_the_five_addition_arms_exist() -> None:
    arms = {p.stem.removeprefix("smollm2-addition-") for p in ADDITION_MANIFESTS}
    assert arms == {"rsft-only", "mh-only", "whale", "adaptive-whale", "whale-mutate"}


def test_a_bad_task_in_a_manifest_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (LOCAL / "smollm2-addition-whale.yaml").read_text().replace("syntheticTask: addition", "syntheticTask: sums")
    )
    with pytest.raises(ManifestError, match="syntheticTask"):
        load_manifest(bad)


def test_the_replayed_candidates_validate() -> None:
    import json

    script = json.loads((LOCAL / "smollm2-addition-proposals.json").read_text())
    files = {c["file"] for batch in script["iterations"].values() for c in batch}
    assert len(files) == 3
    for name in files:
        validate_file(LOCAL / name, DOMAIN.allowed_imports)


@pytest.mark.parametrize(
    ("harness", "replies", "reward"),
    [
        (None, ["3 + 5 = 8."], 0.0),  # h0 submits the reply as written: no tag, no score
        (None, ["<answer>8</answer>"], 1.0),
        ("smollm2-addition-last-number.py", ["3 + 5 = 8."], 1.0),  # the sum read from the words
        ("smollm2-addition-last-number.py", ["3 + 5 = 9."], 0.0),  # ... but the model must compute it
        ("smollm2-addition-retry.py", ["The sum is eight.", "<answer>8</answer>"], 1.0),  # asked again for the tag
        ("smollm2-addition-format-example.py", ["8"], 0.0),
    ],
)
def test_the_candidates_on_real_episodes(harness: str | None, replies: list[str], reward: float) -> None:
    # a real harness subprocess under the scripted model replies (whale replay)
    path = LOCAL / harness if harness else DOMAIN.h0_path_for(ADDITION)
    episode = replay_domain(DOMAIN, {"id": "t", "a": 3, "b": 5}, replies, path)
    assert episode["reward"] == reward


@pytest.mark.parametrize(
    "path",
    [DOMAIN.h0_path_for(ADDITION), *sorted(LOCAL.glob("smollm2-addition-*.py"))],
    ids=lambda p: p.name,
)
def test_no_prompt_of_the_task_holds_an_answer(path: Path) -> None:
    # a number of the harness's own messages that is an item's answer counts as the harness telling the model the
    # answer (answer injection): the first example's "add 2 and 2 ... <answer>4</answer>" got a fair candidate refused
    low, high = tasks.ADDITION_OPERANDS
    answers = [str(n) for n in range(2 * low, 2 * high + 1)]
    for name in ("SYSTEM_PROMPT", "USER_TEMPLATE", "FORMAT_RETRY_MESSAGE"):
        text = _constant(path, name)
        assert not [a for a in answers if occurs(a, normalise(text))], (name, text)


def _constant(path: Path, name: str) -> str:
    """A harness's string constant, read from its source (a harness file is never imported here)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return str(ast.literal_eval(node.value))
    return ""
