"""The local-directory backend and the backend-independent pieces of the storage client.

The behaviour both backends share (round trips, atomic replace, listings, upload/download, errors)
is one parametrised suite in tests/component/test_store_s3.py; here is what only the local backend
has (files on disk, symlinks, temp files) and the pure key rules.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from whale.store import ObjectNotFound, StoreError, open_store
from whale.store.base import join_key, normalize_key
from whale.store.lease import LeaseHeld, LeaseLost, this_process
from whale.store.local import TMP_PREFIX, LocalStore


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("a/b", "a/b"),
        ("/a//b/", "a/b"),
        ("a/./b", "a/b"),
        ("a/x/../b", "a/b"),
        ("runs/r1/phases/c00-weight/result.json", "runs/r1/phases/c00-weight/result.json"),
    ],
)
def test_normalize_key_gives_one_name_per_object(key: str, expected: str) -> None:
    assert normalize_key(key) == expected


@pytest.mark.parametrize("key", ["..", "../x", "a/../../x", "/../etc/passwd"])
def test_normalize_key_refuses_to_leave_the_root(key: str) -> None:
    with pytest.raises(StoreError, match="escapes the store root"):
        normalize_key(key)


@pytest.mark.parametrize("key", ["", "/", "a/.."])
def test_the_root_is_not_an_object(key: str) -> None:
    with pytest.raises(StoreError, match="names the store root"):
        normalize_key(key)
    assert normalize_key(key, allow_root=True) == ""


def test_keys_with_backslash_or_nul_are_refused() -> None:
    with pytest.raises(StoreError, match="backslash"):
        normalize_key("a\\b")
    with pytest.raises(StoreError, match="NUL"):
        normalize_key("a\x00b")


def test_join_key() -> None:
    assert join_key("a/b/", "c") == "a/b/c"
    assert join_key("", "c") == "c"


def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    store = open_store(f"file://{tmp_path}")
    assert isinstance(store, LocalStore) and store.root == tmp_path.resolve()
    assert store.uri == f"file://{tmp_path.resolve()}"


@pytest.mark.parametrize(("uri", "match"), [("", "empty store URI"), ("gs://bucket/x", "unsupported scheme")])
def test_open_store_rejects_unknown_uris(uri: str, match: str) -> None:
    with pytest.raises(StoreError, match=match):
        open_store(uri)


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match="f"):
        LocalStore(tmp_path / "f")


def test_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    store = LocalStore(tmp_path / "store")
    (store.root / "link").symlink_to(outside)
    with pytest.raises(StoreError, match="escapes the store root"):
        store.read_bytes("link/secret")
    with pytest.raises(StoreError, match="escapes the store root"):
        store.write_bytes("link/new", b"x")
    assert not (outside / "new").exists()


def test_a_symlink_to_a_sibling_whose_name_starts_like_the_root_is_refused(tmp_path: Path) -> None:
    """The root's path is a prefix of its sibling's (``store`` of ``store2``): inside means under ``store/``."""
    sibling = tmp_path / "store2"
    sibling.mkdir()
    (sibling / "secret").write_text("s")
    store = LocalStore(tmp_path / "store")
    (store.root / "link").symlink_to(sibling)
    with pytest.raises(StoreError, match="escapes the store root"):
        store.read_bytes("link/secret")


def test_a_symlink_deep_in_a_key_is_checked_and_one_inside_the_root_is_followed(tmp_path: Path) -> None:
    """Only a key's own components are looked at for links (the root was resolved at open): a link below the first
    component is caught as well, through a list or a listing too, and a link that stays inside the store is followed."""
    outside = tmp_path / "outside"
    (outside / "p").mkdir(parents=True)
    (outside / "p" / "secret").write_text("s")
    store = LocalStore(tmp_path / "store")
    store.write_text("runs/r/kept/a.txt", "inside")
    (store.root / "runs" / "r" / "out").symlink_to(outside)
    for read in (
        lambda: store.read_bytes("runs/r/out/p/secret"),
        lambda: store.list("runs/r/out/p/", recursive=False),
        lambda: store.list("runs/r/out/"),
        lambda: store.write_bytes("runs/r/out/p/new", b"x"),
    ):
        with pytest.raises(StoreError, match="escapes the store root"):
            read()
    assert not (outside / "p" / "new").exists()
    (store.root / "runs" / "alias").symlink_to(store.root / "runs" / "r")
    assert store.read_text("runs/alias/kept/a.txt") == "inside"
    assert store.list("runs/alias/kept/", recursive=False) == ["runs/r/kept/a.txt"]  # named as resolved
    assert store.read_json_or_none("runs/missing/x/y.json") is None


def test_objects_are_plain_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_text("runs/r/spec.json", "{}")
    assert (tmp_path / "runs/r/spec.json").read_text() == "{}"
    assert store.local_path("runs/r/spec.json") == tmp_path.resolve() / "runs/r/spec.json"


def test_leftover_temp_files_are_invisible(tmp_path: Path) -> None:
    """A crash between write and rename leaves a temp file: it must not look like an object."""
    store = LocalStore(tmp_path)
    store.write_bytes("d/a", b"1")
    (tmp_path / "d" / f"{TMP_PREFIX}a.xyz").write_bytes(b"half")
    (tmp_path / f"{TMP_PREFIX}b.xyz").write_bytes(b"half")
    assert store.list("") == ["d/a"]
    assert store.list("", recursive=False) == ["d/"]
    assert store.list("d", recursive=False) == ["d/a"]


def test_a_successful_write_leaves_no_temp_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for i in range(3):
        store.write_bytes("x/y", str(i).encode())
    assert sorted(os.listdir(tmp_path / "x")) == ["y"]


def test_a_write_makes_its_folders_and_an_object_private_as_mkstemp_made_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("a/b/c/d.json", b"1")  # folders made on the way (the write's first try finds none)
    store.write_bytes("a/b/c/d.json", b"2")  # and over an existing object, in an existing folder
    assert store.read_bytes("a/b/c/d.json") == b"2"
    assert stat.S_IMODE(os.stat(tmp_path / "a/b/c/d.json").st_mode) == 0o600
    assert os.listdir(tmp_path / "a/b/c") == ["d.json"]


def test_failed_write_leaves_the_old_object_and_no_temp_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("k", b"old")
    with pytest.raises(TypeError):
        store.write_bytes("k", object())  # type: ignore[arg-type]  # bad input, on purpose
    assert store.read_bytes("k") == b"old"
    assert os.listdir(tmp_path) == ["k"]


def test_delete_prunes_emptied_folders_but_never_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("a/b/c/d", b"1")
    store.write_bytes("a/keep", b"2")
    store.delete("a/b/c/d")
    assert not (tmp_path / "a/b").exists()
    assert (tmp_path / "a/keep").exists()
    store.delete("a/keep")
    assert tmp_path.is_dir() and os.listdir(tmp_path) == []


def test_empty_folders_are_not_listed(tmp_path: Path) -> None:
    """S3 has no empty folders; a folder made by hand must not show up either."""
    store = LocalStore(tmp_path)
    (tmp_path / "empty/deeper").mkdir(parents=True)
    store.write_bytes("full/x", b"1")
    assert store.list("", recursive=False) == ["full/"]


def test_a_folder_is_listed_by_a_file_anywhere_under_it_but_not_by_a_temp_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("deep/a/b/c/x", b"1")
    (tmp_path / "halfway/sub").mkdir(parents=True)
    (tmp_path / "halfway/sub" / f"{TMP_PREFIX}x.xyz").write_bytes(b"half")
    store.write_bytes("top", b"1")
    assert store.list("", recursive=False) == ["deep/", "top"]
    assert store.list("deep/a", recursive=False) == ["deep/a/b/"]


def test_a_key_cannot_be_both_object_and_folder(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("a/b", b"1")
    with pytest.raises(StoreError, match="is a folder"):
        store.write_bytes("a", b"2")
    with pytest.raises(StoreError, match="parent of it is an object"):
        store.write_bytes("a/b/c", b"3")
    assert store.read_bytes("a/b") == b"1"


def test_delete_of_a_folder_key_deletes_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("a/b", b"1")
    store.delete("a")
    assert store.read_bytes("a/b") == b"1"


def test_corrupt_json_names_the_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("s.json", b"{not json")
    with pytest.raises(StoreError, match=r"s\.json is not valid JSON"):
        store.read_json("s.json")
    store.write_bytes("m.jsonl", b'{"a": 1}\n{bad\n')
    with pytest.raises(StoreError, match=r"m\.jsonl line 2"):
        store.read_jsonl("m.jsonl")


def test_check_fails_on_a_read_only_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ro")
    store.check()
    store.root.chmod(0o500)
    try:
        if os.access(store.root, os.W_OK):  # root ignores permissions
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(StoreError, match="not writable"):
            store.check()
    finally:
        store.root.chmod(0o700)


def test_download_file_replaces_the_target(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.write_bytes("w", b"new")
    target = tmp_path / "out" / "w"
    target.parent.mkdir()
    target.write_bytes(b"old-and-longer")
    store.download_file("w", target)
    assert target.read_bytes() == b"new"
    with pytest.raises(ObjectNotFound):
        store.download_file("missing", tmp_path / "out" / "m")
    assert not (tmp_path / "out" / "m").exists()


# ----- the run lock: an flock ----------------------------------------------------------------------------

LOCK = "runs/r1/control/lock.json"


def test_the_lock_admits_one_holder_and_names_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    first = store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    info = store.read_lease(LOCK)
    assert info is not None and info.live and info.holder == first.holder
    with pytest.raises(LeaseHeld) as refused:
        LocalStore(tmp_path).acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    message = str(refused.value)
    assert f"pid {os.getpid()}" in message and "(whale run r1)" in message and str(tmp_path) in message
    first.check()
    first.release()
    first.release()  # idempotent
    assert store.read_lease(LOCK).live is False and store.read_lease(LOCK).holder is None
    second = store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    assert store.read_lease(LOCK).holder.owner == second.holder.owner != first.holder.owner
    second.release()


def test_no_lock_file_means_no_holder(tmp_path: Path) -> None:
    assert LocalStore(tmp_path).read_lease(LOCK) is None


def test_a_deleted_lock_file_is_a_lost_lock(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    lease = store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    (tmp_path / LOCK).unlink()
    with pytest.raises(LeaseLost, match="deleted or replaced"):
        lease.check()
    other = store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)  # a new file, a new lock
    lease.release()  # does not touch the new holder's file
    assert store.read_lease(LOCK).holder == other.holder
    other.release()


HOLD_AND_LEAVE_A_CHILD = """
import subprocess, sys
from whale.store.local import LocalStore
from whale.store.lease import this_process
lease = LocalStore(sys.argv[1]).acquire_lease(sys.argv[2], this_process("whale run r1"), 60)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=lease.inherit_fds,
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
"""


def test_a_process_that_inherited_the_lock_keeps_the_run_locked_after_its_parent_died(tmp_path: Path) -> None:
    """A workload left behind by a dead runner still holds the lock: no new runner may start beside it."""
    out = subprocess.run(
        [sys.executable, "-c", HOLD_AND_LEAVE_A_CHILD, str(tmp_path), LOCK],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    leftover = int(out.stdout.strip())
    try:
        with pytest.raises(LeaseHeld, match="is gone, but a process it started") as refused:
            LocalStore(tmp_path).acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
        assert refused.value.info.live
    finally:
        os.kill(leftover, 9)
    deadline = time.monotonic() + 30
    while LocalStore(tmp_path).read_lease(LOCK).live:  # the leftover is reaped by init: poll for it
        assert time.monotonic() < deadline, "the lock outlived its last holder"
        time.sleep(0.05)
    LocalStore(tmp_path).acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60).release()
