"""h0 for chess_puzzles: the paper's deliberately plain base harness.

Each turn shows the side to move, the FEN, an ASCII board, the solver's accepted moves, the opponent's
last reply and the legal moves as ``- [uci] SAN=...``; the model answers ``<move>uci</move>``. The
environment judges every answer: one malformed answer and one illegal move are forgiven (it says what was
wrong and the model tries again), a legal wrong move ends the puzzle. At most 9 model calls.
"""

import re

from whale.harness.api import BaseHarness, env_action, fill

MOVE_TAG = re.compile(r"<move>\s*(.*?)\s*</move>", re.IGNORECASE | re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = (
        "You are a strong chess player solving a chess puzzle. Find the best move for the side to move. "
        "Answer with exactly one move in UCI notation inside <move></move> tags, for example <move>e2e4</move>."
    )
    USER_TEMPLATE = (
        "You play {side_to_move}.\n"
        "FEN: {fen}\n"
        "Board (white pieces are uppercase, rank 8 at the top):\n"
        "{board}\n"
        "Your moves so far: {accepted}\n"
        "Opponent's last move: {last_reply}\n"
        "Legal moves:\n"
        "{legal}\n"
        "Reply with your move as <move>uci</move>."
    )
    MAX_TURNS = 9
    # A reply without a <move> tag is sent to the environment as "no move": the environment owns the
    # one-retry rule for malformed answers, so the harness itself adds no retries of its own.
    MAX_FORMAT_RETRIES = 0
    FORMAT_RETRY_MESSAGE = "Reply with your move as <move>uci</move>."

    def fields(self, observation):
        """The template fields: the environment's observation plus the rendered lists."""
        accepted = observation.get("accepted_moves") or []
        sans = observation.get("accepted_moves_san") or []
        legal = observation.get("legal_moves") or []
        last = observation.get("last_reply")
        return {
            **observation,
            "accepted": ", ".join(f"{u} ({s})" for u, s in zip(accepted, sans, strict=False)) or "none yet",
            "last_reply": f"{last} ({observation.get('last_reply_san')})" if last else "none",
            "legal": "\n".join(f"- [{m['uci']}] SAN={m['san']}" for m in legal),
        }

    def build_messages(self, task, state):
        messages = [{"role": "system", "content": self.SYSTEM_PROMPT}] if self.SYSTEM_PROMPT else []
        messages.append({"role": "user", "content": fill(self.USER_TEMPLATE, self.fields(task))})
        return messages

    def parse_action(self, text, state):
        moves = MOVE_TAG.findall(text or "")
        return env_action(moves[-1] if moves else None)

    def format_observation(self, observation, state):
        note = observation.get("feedback") or ""
        return (note + "\n\n" if note else "") + fill(self.USER_TEMPLATE, self.fields(observation))
