"""``Isolation(host_network=True)``: the one sandbox with a network (the ``cli`` proposer's agent must reach
its model's API). It must be asked for by name; it opens the network and nothing else — the filesystem,
uid, PID namespace and environment walls stay; the host's DNS and CA files come read-only."""

from __future__ import annotations

import socket

import pytest

from tests.security.harness_probes import CHECKOUT
from whale.sandbox import Isolation, Outcome, run_python

PROBE = """
import os, socket, sys
port = int(sys.argv[1])
try:
    socket.create_connection(("127.0.0.1", port), timeout=3).send(b"hi")
    print("connected yes")
except OSError as exc:
    print("refused", type(exc).__name__)
print("checkout", os.path.exists(sys.argv[2]))
print("hosts", open("/etc/nsswitch.conf").read().split("hosts:")[1].strip())
try:
    open("/etc/resolv.conf", "a")
    print("resolv writable")
except OSError as exc:
    print("resolv", type(exc).__name__)
print("uid", os.getuid(), "pid", os.getpid())
"""


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv.getsockname()[1]
    srv.close()


def test_the_default_has_no_network_and_host_must_be_named():
    assert Isolation().host_network is False and not Isolation().shares_network
    assert Isolation(host_network=True).shares_network and Isolation.none().shares_network
    with pytest.raises(ValueError, match="Isolation.host_network must be True or False, got 'yes'"):
        Isolation(host_network="yes")


@pytest.mark.timeout(60)
def test_host_network_opens_the_network_and_nothing_else(listener: int):
    args = [str(listener), str(CHECKOUT / "whale" / "__init__.py")]
    walled = run_python(PROBE, args=args)
    assert walled.outcome is Outcome.OK, walled.stderr[-2000:]
    assert "refused" in walled.stdout and walled.isolation["network"] == "netns"

    opened = run_python(PROBE, args=args, isolation=Isolation(host_network=True))
    assert opened.outcome is Outcome.OK, opened.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in opened.stdout.splitlines())
    assert lines["connected"] == "yes" and opened.isolation["network"] == "host"
    assert lines["checkout"] == "False"  # the filesystem wall stays
    assert lines["hosts"] == "files dns"  # names resolve through the host's resolver configuration
    assert lines["resolv"] in ("OSError", "PermissionError")  # mounted read-only (EROFS) when the host has one
    uid, pid = lines["uid"].split(" pid ")
    assert int(uid) != 0 and int(pid) == 2  # its own uid and PID namespace
    assert opened.isolation["capabilities"] == "none"
