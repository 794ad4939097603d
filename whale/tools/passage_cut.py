"""Passages cut to a number of the policy's tokens, as the reference's retrieval server cuts them.

The reference (krafton-ai/WHALE ``retrieval_server_async.py``) cuts each hit's ``contents`` (title line and
text) to its first ``max_doc_tokens`` tokens of the policy's tokenizer before answering, so a passage costs
the model the same number of tokens whatever its words. :class:`TokenCut` does that with a tokenizer loaded
once from a local folder; the retriever service applies it when a request names ``max_doc_tokens``.

On a cluster the operator gives the retriever's pod that folder: an init container runs
``python -m whale.tools.passage_cut --model NAME [--revision R] --dest DIR`` (:func:`fetch_tokenizer`), which
copies the policy model's tokenizer files (``spec.experiment.model.name``: a folder in the image, or a Hugging Face id
resolved as the vLLM pod's ``fetch-weights`` resolves it, but only the tokenizer's files) and checks they load.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import sys
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


#: the files a tokenizer folder needs (``AutoTokenizer.from_pretrained``), never the weights
TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.tiktoken",
    "config.json",
    "chat_template*",
)


def fetch_tokenizer(model: str, dest: Path, revision: str | None = None) -> TokenCut:
    """``model``'s tokenizer in ``dest`` (a local folder's files copied, a hub id's downloaded), loaded once to
    prove it works; a ``dest`` that loads already is kept (the init container may run again)."""
    dest = Path(dest)
    try:
        return TokenCut.load(dest)
    except RetrieverError:
        pass
    source = Path(model)
    if source.is_dir():
        files = [
            f for f in source.iterdir() if f.is_file() and any(fnmatch.fnmatch(f.name, p) for p in TOKENIZER_FILES)
        ]
        dest.mkdir(parents=True, exist_ok=True)
        for f in files:  # each copy atomic: a half-written file is never loaded
            tmp = dest / f".{f.name}.part"
            shutil.copyfile(f, tmp)
            os.replace(tmp, dest / f.name)
    else:
        try:
            from huggingface_hub import snapshot_download

            snapshot_download(model, revision=revision, local_dir=str(dest), allow_patterns=list(TOKENIZER_FILES))
        except Exception as exc:  # noqa: BLE001 - hub errors are many; the message matters
            raise RetrieverError(
                f"spec.experiment.model.name {model!r}: neither a folder here nor a Hugging Face repository whose tokenizer "
                f"could be downloaded ({exc})"
            ) from None
    try:
        return TokenCut.load(dest)
    except RetrieverError as exc:
        raise RetrieverError(f"spec.experiment.model.name {model!r}: its tokenizer does not load ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m whale.tools.passage_cut", description="place the policy's tokenizer for the retriever"
    )
    p.add_argument("--model", required=True, help="spec.experiment.model.name: a local folder or a Hugging Face id")
    p.add_argument("--revision", default=None, help="spec.experiment.model.revision (a hub id's)")
    p.add_argument("--dest", type=Path, required=True, help="the folder the retriever's --tokenizer reads")
    args = p.parse_args(argv)
    try:
        cut = fetch_tokenizer(args.model, args.dest, args.revision)
    except RetrieverError as exc:
        print(f"passage_cut: {exc}", file=sys.stderr)
        return 1
    print(f"tokenizer of {args.model} in {args.dest} ({type(cut.tokenizer).__name__})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
