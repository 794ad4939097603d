"""Passages cut to a number of the policy's tokens, as the reference's retrieval server cuts them.

The reference (krafton-ai/WHALE ``retrieval_server_async.py``) cuts each hit's ``contents`` (title line and
text) to its first ``max_doc_tokens`` tokens of the policy's tokenizer before answering, so a passage costs
the model the same number of tokens whatever its words. :class:`TokenCut` does that with a tokenizer loaded
once from a local folder; the retriever service applies it when a request names ``max_doc_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale.tools.retrieval_index import Hit, Passage, RetrieverError


@dataclass(frozen=True)
class TokenCut:
    """Cuts passages with one tokenizer (any object with ``encode``/``decode`` of a transformers tokenizer)."""

    tokenizer: Any
    #: what the service reports on /healthz (the folder's name)
    name: str

    @classmethod
    def load(cls, folder: Path) -> TokenCut:
        """The tokenizer saved in ``folder`` (never downloaded: the service runs offline)."""
        from transformers import AutoTokenizer

        if not (Path(folder) / "tokenizer_config.json").is_file() and not (Path(folder) / "tokenizer.json").is_file():
            raise RetrieverError(f"--tokenizer {folder}: no tokenizer.json or tokenizer_config.json there")
        try:
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise RetrieverError(f"--tokenizer {folder}: cannot load it ({exc})") from None
        return cls(tok, Path(folder).name)

    def text(self, text: str, max_tokens: int) -> str:
        """``text``'s first ``max_tokens`` tokens, decoded; ``text`` itself when it is that short."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= max_tokens else str(self.tokenizer.decode(ids[:max_tokens]))

    def passage(self, passage: Passage, max_tokens: int) -> Passage:
        """The passage with its ``contents`` cut; its text is what is left of the text (the part after the title
        line, empty when the cut falls inside the title), its title unchanged."""
        cut = self.text(passage.contents, max_tokens)
        if cut == passage.contents:
            return passage
        if "\n" not in passage.contents:  # a corpus row without a title line: the text is the contents
            return Passage(passage.id, passage.title, cut, cut)
        return Passage(passage.id, passage.title, cut.partition("\n")[2], cut)

    def hits(self, rows: list[list[Hit]], max_tokens: int) -> list[list[Hit]]:
        return [[Hit(self.passage(h.passage, max_tokens), h.score) for h in row] for row in rows]
