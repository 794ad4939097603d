"""How a retriever's row is read (one rule for the corpus, the service client and the prototyping kit)."""

from __future__ import annotations

import pytest

from whale.tools.passage_row import passage_fields
from whale.tools.retrieval_index import Hit, passage_from_row


def test_a_row_with_title_and_text_is_read_as_given():
    row = {"id": 7, "title": "Paris", "text": "Capital of France.", "contents": '"Paris"\nCapital of France.'}
    assert passage_fields(row) == ("7", "Paris", "Capital of France.", '"Paris"\nCapital of France.')


def test_a_search_r1_row_has_only_contents():
    assert passage_fields({"id": "1", "contents": '"Paris"\nCapital of France.'}) == (
        "1",
        "Paris",
        "Capital of France.",
        '"Paris"\nCapital of France.',
    )
    assert passage_fields({"id": "2", "contents": "no title line"})[1:3] == ("no title line", "no title line")


def test_an_empty_text_is_kept_the_token_cut_fell_inside_the_title():
    row = {"id": "3", "title": "Lothair II", "text": "", "contents": '"Lothair'}
    assert passage_fields(row)[2] == ""
    assert Hit.from_wire({"document": row, "score": 1.0}).passage.text == ""  # the service client reads it so too
    assert passage_from_row(row).title == "Lothair II"


@pytest.mark.parametrize("row", [{"contents": "x"}, {"id": "1"}, {"id": "1", "contents": 5}])
def test_a_row_that_is_not_one_raises(row):
    with pytest.raises((KeyError, TypeError)):
        passage_fields(row)
