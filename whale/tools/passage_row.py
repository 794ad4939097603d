"""A retriever's row as (id, title, text, contents), standard library only: one rule for the corpus reader, the
search tool's service client (``whale.tools.retrieval_index.passage_from_row``) and the proposer's prototyping kit
(``proto/whale/tools/passage_row.py``, this file's source), so both read a ``/retrieve`` answer alike.

Rows follow the Search-R1/FlashRAG format: ``id``, ``contents`` (``"title"\\ntext``) and optionally ``title`` /
``text``. A ``text`` the row gives is kept even when empty: the retriever's token cut leaves it empty when the
cut falls inside the title line, and the reference's client then renders no text either.
"""

from __future__ import annotations

from typing import Any


def passage_fields(row: dict[str, Any]) -> tuple[str, str, str, str]:
    """(id, title, text, contents) of a row; KeyError/TypeError when it is not one."""
    contents = row.get("contents") or f'"{row["title"]}"\n{row["text"]}'
    if not isinstance(contents, str):
        raise TypeError("'contents' is not a string")
    head, _, tail = contents.partition("\n")
    title = row.get("title") or head.strip('"')
    text = row.get("text")
    if text is None:
        text = tail if tail else contents
    return str(row["id"]), str(title), str(text), contents
