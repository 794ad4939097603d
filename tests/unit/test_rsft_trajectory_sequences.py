"""One training sequence per trajectory on a tiny Qwen3 (issue 30): a chess-style trace, whose Qwen3.5-style
template drops earlier thinking before each new user message, trains as one sequence, so an RSFT step makes the
optimiser updates ``whale plan`` counts from kept trajectories; ``sequences: turn`` makes more."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.fixtures.models import build_tiny_qwen3  # noqa: E402
from tests.fixtures.thinking import thinking_tokenizer  # noqa: E402
from whale.core.batching import optimizer_updates  # noqa: E402
from whale.rsft.collate import encode_trajectories  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.rejection import Trajectory  # noqa: E402
from whale.rsft.trainer import SFTTrainer  # noqa: E402


def chess_trace(i: int) -> Trajectory:
    """Three solver moves, the environment's replies as user messages, thinking on (as the chess domain)."""
    msgs: list[dict[str, str]] = [{"role": "user", "content": f"Puzzle {i}. Move?"}]
    for turn in range(3):
        msgs.append({"role": "assistant", "content": f"line {i} {turn}\n</think>\n\n<move>e2e{turn + 3}</move>"})
        if turn < 2:
            msgs.append({"role": "user", "content": f"Opponent replied. Move {turn + 2}?"})
    return Trajectory(i, tuple(msgs), 1.0, template_kwargs={"enable_thinking": True})


@pytest.mark.parametrize(("sequences", "per_trace"), [("trajectory", 1), ("turn", 3)])
def test_an_rsft_step_trains_one_sequence_per_kept_trajectory_and_makes_the_planned_updates(sequences, per_trace):
    tok = thinking_tokenizer()
    kept = [chess_trace(i) for i in range(5)]
    examples = encode_trajectories(tok, kept, sequences=sequences)
    assert len(examples) == per_trace * len(kept)
    # the model's tokens carry the loss either way: the same count of loss tokens
    assert sum(e.n_target for e in examples) == sum(
        e.n_target for e in encode_trajectories(tok, kept, sequences="turn")
    )
    model = build_tiny_qwen3(len(tok), seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = RSFTConfig(mini_batch_size=2, micro_batch_size_per_gpu=2, learning_rate=1e-3, precision="fp32")
    stats = SFTTrainer(model, cfg, device=torch.device("cpu"), pad_id=tok.pad_token_id).train(examples, lr=1e-3, seed=0)
    planned = optimizer_updates(len(kept), ranks=1, mini_batch_size=2, sft_epochs=1, scope="perRank")
    assert planned == 3
    assert stats.updates == (planned if sequences == "trajectory" else 8)  # 15 turn sequences -> 8 updates
    assert stats.tokens == sum(e.n_target for e in examples)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
