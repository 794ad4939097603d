"""The archive in a real (local) store: records round-trip, and the proposer's local view is kept up
to date incrementally."""

from pathlib import Path

from whale.metaharness.archive import Archive
from whale.metaharness.records import Candidate, Status
from whale.store import open_store


def test_archive_round_trip_and_incremental_view(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    archive = Archive(store, "runs/r/archive/c01")
    archive.init()
    cand = Candidate(id="i02-c1", iteration=2, sha="abc", name="x", rationale="because")
    archive.add(cand, "code = 1\n")
    archive.write_traces("i02-c1", [{"reward": 1.0}])
    assert archive.candidates() == [cand]
    assert archive.code("i02-c1") == "code = 1\n"
    assert store.read_text(archive.candidate_key("i02-c1", "rationale.md")) == "because\n"

    view = archive.materialise(tmp_path / "view")
    assert (view / "README.md").read_text().startswith("# Meta-Harness archive")
    assert (view / "candidates/i02-c1/traces.jsonl").read_text() == '{"reward": 1.0}\n'
    # a status change reaches the view; write-once files are not fetched again
    archive.put(cand.with_(status=Status.SCORED, score=1.0))
    archive.write_summary()
    (view / "candidates/i02-c1/traces.jsonl").write_text("local copy kept")
    archive.materialise(view)
    assert '"status": "scored"' in (view / "candidates/i02-c1/meta.json").read_text()
    assert "i02-c1 | scored" in (view / "summary.md").read_text()
    assert (view / "candidates/i02-c1/traces.jsonl").read_text() == "local copy kept"
