"""The ``cli`` agent's network (``proposer.network: proxy``): it reaches the names its allow-list names, nothing else.

A test double of an agent CLI (a Python program standing in for Claude Code) runs through the real launcher
(:class:`CLIAgentProposer` with its :class:`InProcessLauncher`, as ``whale run`` does) in the real sandbox, and tries
what a hostile agent would, with real sockets on loopback:

(a) a direct TCP connection to a loopback server standing in for vLLM's key-less dev endpoints;
(b) ``CONNECT`` through the proxy to a host not on the list;
(c) ``CONNECT`` to an allow-listed name that resolves to 127.0.0.1 (a private address: what DNS rebinding gets);
(d) a plain ``GET http://...`` through the proxy;
(e) ``CONNECT`` to an IP literal (``127.0.0.1``, ``[::1]``, ``2130706433``);
(f) ``CONNECT`` to an allow-listed name on its port: opened, bytes carried both ways — only when the spec's author
    lists the name in ``allowPrivateHosts`` too, since the echo server standing in for the API is on loopback.

First the same program runs with ``network: host``, to show each attack gets what it goes for on this machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.test_proposer_cli_sandbox import _report, _request
from whale.core.egress import EgressPolicy, EgressRefused, host_name, parse_entry
from whale.metaharness.proposer.base import ProposerError
from whale.metaharness.proposer.cli_agent import AgentJob, AgentWalls, CLIAgentProposer, run_agent_sandbox
from whale.sandbox import Isolation, IsolationLevel
from whale.sandbox.egress import EgressProxy
from whale.sandbox.process import base_python

REPO = Path(__file__).resolve().parents[2]

#: the test double of an agent CLI: every way out it tries, as a report
AGENT = r"""
import json, os, socket, sys
dev_port, echo_port, tool_port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
proxy = os.environ.get("HTTPS_PROXY", "")
results = {"proxy": proxy, "no_proxy": os.environ.get("NO_PROXY")}
host, _, port = proxy.removeprefix("http://").partition(":")


def attempt(name, fn):
    try:
        results[name] = "OK: " + repr(fn())[:300]
    except BaseException as exc:
        results[name] = "BLOCKED: %s %s" % (type(exc).__name__, str(exc)[:200])


def through_proxy(request, payload=b""):
    if not proxy:
        raise OSError("no proxy in the environment")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    status = head.split(b"\r\n", 1)[0].decode()
    if " 200 " not in status + " ":
        raise PermissionError(status)
    if payload:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        return got.decode()
    return status


def connect(authority, payload=b""):
    return through_proxy(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority.encode(), authority.encode()), payload)


attempt("a direct to the dev endpoint", lambda: socket.create_connection(("127.0.0.1", dev_port), timeout=3).send(b"x"))
attempt("a direct to the kit's service", lambda: socket.create_connection(("127.0.0.1", tool_port), timeout=3).send(b"x"))
attempt("a direct to cloud metadata", lambda: socket.create_connection(("169.254.169.254", 80), timeout=3).send(b"x"))
attempt("b not on the list", lambda: connect("example.com:443"))
attempt("b allow-listed name, other port", lambda: connect("localhost:%d" % dev_port))
attempt("c allow-listed name resolving to loopback", lambda: connect("localhost:%d" % echo_port, b"ping"))
attempt("d plain GET", lambda: through_proxy(b"GET http://localhost:%d/ HTTP/1.1\r\nHost: x\r\n\r\n" % echo_port))
attempt("e IPv4 literal", lambda: connect("127.0.0.1:%d" % echo_port))
attempt("e IPv6 literal", lambda: connect("[::1]:%d" % echo_port))
attempt("e decimal IPv4", lambda: connect("2130706433:%d" % echo_port))
attempt("f allow-listed, private opt-in", lambda: connect("localhost:%d" % echo_port, b"ping"))
attempt("g the kit's service", lambda: connect("127.0.0.1:%d" % tool_port, b"ping"))
results["kit"] = sorted(os.listdir("proto")) if os.path.isdir("proto") else []
os.makedirs("candidates", exist_ok=True)
print("REPORT " + json.dumps(results), flush=True)
"""

ATTACKS = (
    "a direct to the dev endpoint",
    "a direct to the kit's service",
    "a direct to cloud metadata",
    "b not on the list",
    "b allow-listed name, other port",
    "d plain GET",
    "e IPv4 literal",
    "e IPv6 literal",
    "e decimal IPv4",
)


def kit(tool: EchoServer) -> dict[str, str]:
    """A prototyping kit listing one tool service of the run (what the search puts in the workspace)."""
    services = json.dumps({"retriever": f"http://127.0.0.1:{tool.port}"})
    return {"proto/README.md": "# kit", "proto/tools.py": "# clients", "proto/services.json": services}


class EchoServer:
    """A loopback TCP server standing in for the model's API (TLS-less): answers ``echo:`` + what it got, once the
    client half-closes; records how many connections it served."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.served = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                data = b""
                try:
                    while chunk := conn.recv(4096):
                        data += chunk
                    conn.sendall(b"echo:" + data)
                except OSError:
                    continue
                self.served += 1

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (closing alone does not, on Linux)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(10)
        if self._thread.is_alive():
            raise RuntimeError("the echo server's thread did not end")


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def tool() -> Iterator[EchoServer]:
    """A loopback server standing in for one of the run's tool services (the retriever) that the kit lists."""
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def agent(tmp_path: Path) -> dict:
    archive = tmp_path / "work" / "archive"
    archive.mkdir(parents=True)
    (archive / "summary.md").write_text("# summary\n")
    install = tmp_path / "agent-install"
    install.mkdir()
    (install / "agent.py").write_text(AGENT)
    return {"archive": archive, "install": install, "tmp": tmp_path}


def _run(agent: dict, dev_port: int, echo_port: int, tool: EchoServer, **network: object) -> tuple[dict, list]:
    argv = [base_python(), str(agent["install"] / "agent.py"), str(dev_port), str(echo_port), str(tool.port)]
    proposer = CLIAgentProposer(argv, read_paths=[str(agent["install"])], **network)  # type: ignore[arg-type]
    request = dataclasses.replace(_request(agent, timeout_s=60), workspace=kit(tool))
    report = asyncio.run(proposer.propose(request))
    assert report.stopped_by == "exit", report.notes
    transcript = report.transcript[0]
    return _report(transcript["output_tail"]), transcript["isolation"].get("egress", [])


@pytest.mark.timeout(120)
def test_with_the_hosts_network_the_attacks_get_what_they_go_for(agent: dict, listener, echo: EchoServer, tool):
    """What the proxy must stop is really there: with ``network: host`` the dev endpoint answers."""
    port, connected = listener
    got, _ = _run(agent, port, echo.port, tool, network="host")
    assert got["a direct to the dev endpoint"].startswith("OK") and connected()
    assert got["a direct to the kit's service"].startswith("OK")
    assert got["kit"] == ["README.md", "services.json", "tools.py"]
    assert got["proxy"] == ""  # and no proxy to go through


@pytest.mark.timeout(120)
def test_behind_the_proxy_every_attack_fails(agent: dict, listener, echo: EchoServer, tool: EchoServer):
    port, connected = listener
    got, decisions = _run(agent, port, echo.port, tool, network="proxy", allow_hosts=[f"localhost:{echo.port}"])
    assert got["proxy"] == "http://127.0.0.1:3128" and got["no_proxy"] == ""
    # the run's tool service its kit lists: reachable through the proxy, exactly that address and port
    assert got["kit"] == ["README.md", "services.json", "tools.py"]
    assert got["g the kit's service"] == "OK: 'echo:ping'" and tool.served == 1
    decisions = [d for d in decisions if d != f"allowed: 127.0.0.1:{tool.port} -> 127.0.0.1"]
    assert {name: got[name] for name in ATTACKS if not got[name].startswith("BLOCKED")} == {}
    # (c): on the list, but it resolves to loopback and nobody opted in: refused before any connection
    assert got["c allow-listed name resolving to loopback"].startswith("BLOCKED: PermissionError HTTP/1.1 403")
    assert got["f allow-listed, private opt-in"].startswith("BLOCKED: PermissionError HTTP/1.1 403")
    assert "405" in got["d plain GET"] and "403" in got["b not on the list"] and "403" in got["e IPv4 literal"]
    assert not connected() and echo.served == 0  # neither the dev endpoint nor the echo server saw a byte
    assert decisions and all(d.startswith("refused") for d in decisions)
    assert any("not a public address" in d for d in decisions) and any("IP literal" in d for d in decisions)


@pytest.mark.timeout(120)
def test_an_allow_listed_name_carries_bytes_both_ways_and_only_it(agent: dict, listener, echo: EchoServer, tool):
    port, connected = listener
    got, decisions = _run(
        agent,
        port,
        echo.port,
        tool,
        network="proxy",
        allow_hosts=[f"localhost:{echo.port}"],
        allow_private_hosts=["localhost"],
    )
    assert got["f allow-listed, private opt-in"] == "OK: 'echo:ping'"
    assert got["c allow-listed name resolving to loopback"] == "OK: 'echo:ping'"  # the same request, now opted in
    assert {name: got[name] for name in ATTACKS if not got[name].startswith("BLOCKED")} == {}
    assert not connected() and echo.served == 2
    assert decisions.count(f"allowed: localhost:{echo.port} -> 127.0.0.1") == 2


def test_the_policy_refuses_literals_and_names_the_field():
    for literal in ("127.0.0.1", "[::1]", "::1", "127.1", "0x7f000001", "2130706433"):
        with pytest.raises(EgressRefused, match="IP literal|not a host name"):
            host_name(literal)
    assert parse_entry("API.Anthropic.com.") == ("api.anthropic.com", 443)
    assert parse_entry("example.com:8443") == ("example.com", 8443)
    with pytest.raises(ValueError, match="private hosts \\['other.example'\\] are not among the hosts"):
        EgressPolicy(("api.anthropic.com",), ("other.example",))
    with pytest.raises(ProposerError, match="proposer allowHosts/allowPrivateHosts: egress allow-list: '10.0.0.1'"):
        AgentWalls(allow_hosts=("10.0.0.1",))
    policy = EgressPolicy(("api.anthropic.com",))
    with pytest.raises(EgressRefused, match="resolves to 169.254.169.254, not a public address"):
        policy.address("api.anthropic.com", "169.254.169.254")
    with pytest.raises(EgressRefused, match="resolves to ::ffff:a00:1"):
        policy.address("api.anthropic.com", "::ffff:10.0.0.1")
    assert str(policy.address("api.anthropic.com", "160.79.104.10")) == "160.79.104.10"


@pytest.mark.timeout(60)
def test_the_proxy_dials_the_address_it_checked(echo: EchoServer):
    """DNS rebinding: a name that answers a public address first and loopback afterwards. The proxy resolves once,
    refuses the name when any answer is not public, and connects to an address it checked, never the name."""
    answers = [["93.184.215.14", "127.0.0.1"], ["127.0.0.1"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[min(len(asked) - 1, 1)]

    with EgressProxy(EgressPolicy((f"rebind.example:{echo.port}",)), resolver=rebinding) as proxy:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(proxy.socket_path)
            s.sendall(f"CONNECT rebind.example:{echo.port} HTTP/1.1\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 403")
    assert asked == ["rebind.example"] and echo.served == 0


@pytest.mark.timeout(60)
def test_the_proxy_bounds_connections(echo: EchoServer):
    with EgressProxy(EgressPolicy((f"localhost:{echo.port}",), ("localhost",)), max_connections=1) as proxy:
        with socket.socket(socket.AF_UNIX) as first, socket.socket(socket.AF_UNIX) as second:
            first.settimeout(10)
            second.settimeout(10)
            first.connect(proxy.socket_path)
            first.sendall(f"CONNECT localhost:{echo.port} HTTP/1.1\r\n\r\n".encode())
            assert first.recv(4096).startswith(b"HTTP/1.1 200")
            second.connect(proxy.socket_path)
            assert second.recv(4096).startswith(b"HTTP/1.1 503")
            first.sendall(b"x")
            first.shutdown(socket.SHUT_WR)
            assert first.recv(4096) == b"echo:x"


def test_proxy_mode_never_runs_without_its_own_network_namespace(agent: dict):
    job = AgentJob(files={"whale-agent.json": "{}"}, archive_dir=str(agent["archive"]), timeout_s=5, isolation="none")
    with pytest.raises(ProposerError, match="network: proxy needs spec.execution.sandbox.isolation: namespaces"):
        run_agent_sandbox(job, AgentWalls(network="proxy"))
    with pytest.raises(ValueError, match="egress_socket needs level 'namespaces'"):
        Isolation(level=IsolationLevel.NONE, egress_socket="/tmp/x.sock")
    with pytest.raises(ValueError, match="egress_socket and host_network exclude each other"):
        Isolation(host_network=True, egress_socket="/tmp/x.sock")


CALLER = """
import json, os, sys
for name in ("max_net_namespaces", "max_mnt_namespaces"):  # as a host that forbids namespaces
    open(f"/proc/sys/user/{{name}}", "w").write("0")
sys.path.insert(0, {repo!r})
from whale.metaharness.proposer.base import ProposerError
from whale.metaharness.proposer.cli_agent import AgentJob, AgentWalls, run_agent_sandbox
job = AgentJob(files={{"whale-agent.json": "{{}}"}}, archive_dir={archive!r}, timeout_s=5)
try:
    result = run_agent_sandbox(job, AgentWalls(network="proxy"))
    print(json.dumps({{"ran": True, "isolation": result.isolation}}))
except ProposerError as exc:
    print(json.dumps({{"ran": False, "error": str(exc)}}))
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="limits namespaces inside a user namespace of a root caller")
def test_where_namespaces_are_refused_proxy_mode_fails_closed(agent: dict):
    """Real refusal (the kernel's namespace limits set to 0 in a user namespace around the launcher): the agent's
    sandbox does not start, the message says why, and nothing runs with the host's network instead."""
    work = Path(tempfile.mkdtemp(prefix="whale-egress-closed-"))
    try:
        script = work / "caller.py"
        script.write_text(textwrap.dedent(CALLER).format(repo=str(REPO), archive=str(agent["archive"])))
        wrapper = (
            "import ctypes, os, runpy, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "uid, gid = os.geteuid(), os.getegid()\n"
            "assert libc.unshare(0x10000000) == 0\n"
            "open('/proc/self/setgroups', 'w').write('deny')\n"
            "open('/proc/self/uid_map', 'w').write(f'{uid} {uid} 1')\n"
            "open('/proc/self/gid_map', 'w').write(f'{gid} {gid} 1')\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=90, cwd=str(work)
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert out["ran"] is False, out
    assert out["error"].startswith("the cli agent's sandbox cannot start: sandbox setup failed: unshare(")
    assert "No space left on device" in out["error"]


@pytest.mark.parametrize("example", ["math-whale", "searchqa-whale", "chess-whale"])
def test_the_operator_renders_the_allow_list_into_the_agent_container(example: str):
    """The rendered search Job: the agent's container gets the spec's allow-list and, as services, exactly the tool
    service URLs the search container gets (what its kit lists), nothing of the run's vLLM or store."""
    from tests.operator.test_least_privilege import EXAMPLES, wire_of
    from tests.operator.test_manifests import children_of
    from whale_operator.cluster_spec import ClusterRunSpec

    spec = ClusterRunSpec.model_validate(wire_of(next(p for p in EXAMPLES if p.stem == example)))
    [pod] = [
        o["spec"]["template"]["spec"]
        for o in children_of(spec)
        if o["kind"] == "Job" and o["spec"]["template"]["spec"].get("initContainers")
    ]
    [agent] = [c for c in pod["initContainers"] if c["name"] == "proposer-agent"]
    command = agent["command"]
    assert command[command.index("--network") + 1] == "proxy"
    assert [command[i + 1] for i, a in enumerate(command) if a == "--allow-host"] == ["api.anthropic.com"]
    assert "--allow-private-host" not in command
    services = [command[i + 1] for i, a in enumerate(command) if a == "--allow-service"]
    worker_env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    tool_urls = [v for k, v in worker_env.items() if k in ("WHALE_RETRIEVER_URL", "WHALE_CODE_URL", "WHALE_ENV_URL")]
    assert services == tool_urls and (services or example == "chess-whale")  # children_of deploys no env service
    assert worker_env["WHALE_INFERENCE_URL"] not in services


@pytest.mark.timeout(120)
def test_on_a_cluster_the_agent_containers_runner_serves_the_proxy(agent: dict, listener, echo: EchoServer, tool):
    """The same attacks through the operator-rendered ``proposer-agent`` runner (a real process, the search side in
    this one): the runner starts each session's proxy with the allow-list of its command line."""
    from tests.fixtures.kube import wait_for
    from tests.operator.test_least_privilege import EXAMPLES, wire_of
    from tests.security.test_proposer_agent_container import rendered_runner
    from whale.metaharness.proposer import agent_exchange as ex
    from whale.tools.process import stop_process
    from whale_operator.cluster_spec import ClusterRunSpec

    port, connected = listener
    exchange = agent["tmp"] / "whale-agent"
    archive = exchange / "whale-search-x" / "archive"
    archive.mkdir(parents=True)
    (archive / "summary.md").write_text("# summary\n")
    wire = wire_of(next(p for p in EXAMPLES if p.stem == "math-whale"))
    proposer = {
        **wire["harnessSearch"]["proposer"],
        "command": ["agent"],
        "readPaths": [str(agent["install"])],
        "allowHosts": [f"localhost:{echo.port}"],
        "allowPrivateHosts": ["localhost"],
    }
    spec = ClusterRunSpec.model_validate({**wire, "harnessSearch": {**wire["harnessSearch"], "proposer": proposer}})
    command, env = rendered_runner(spec, exchange, {"whale-proposer/api-key": "sk-agent"})
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (exchange / ex.READY).exists() or proc.poll() is not None, 30, what="the runner's ready")
        assert proc.poll() is None, proc.communicate(timeout=10)[0]
        argv = [base_python(), str(agent["install"] / "agent.py"), str(port), str(echo.port), str(tool.port)]
        search_side = CLIAgentProposer(argv, network="proxy", launcher=ex.ExchangeLauncher(exchange))
        request = dataclasses.replace(_request({**agent, "archive": archive}, timeout_s=60), workspace=kit(tool))
        report = asyncio.run(search_side.propose(request))
    finally:
        stop_process(proc)
    assert report.stopped_by == "exit", report.notes
    got = _report(report.transcript[0]["output_tail"])
    assert got["f allow-listed, private opt-in"] == "OK: 'echo:ping'"
    assert {name: got[name] for name in ATTACKS if not got[name].startswith("BLOCKED")} == {}
    assert not connected() and report.transcript[0]["isolation"]["network"] == "egress"
    # the kit's service is not among the runner's --allow-service (the operator renders the run's own): a request
    # never widens the runner's list
    assert got["g the kit's service"].startswith("BLOCKED") and tool.served == 0


SANDBOX_HOST_CALLER = """
import json, socket, sys, threading
sys.path.insert(0, {repo!r})
from whale.core.egress import EgressPolicy
from whale.sandbox import Isolation, run_python
from whale.sandbox.egress import EgressProxy

server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]


def echo():
    conn, _ = server.accept()
    with conn:
        conn.sendall(b"echo:" + conn.recv(100))


threading.Thread(target=echo, daemon=True).start()
program = '''
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT localhost:%s HTTP/1.1\\\\r\\\\n\\\\r\\\\n" % sys.argv[1].encode())
print(s.recv(200).split(b"\\\\r\\\\n")[0].decode())
s.sendall(b"hi")
print(s.recv(100).decode())
'''
with EgressProxy(EgressPolicy((f"localhost:{{port}}",), ("localhost",))) as proxy:
    r = run_python(program, args=[str(port)], isolation=Isolation(egress_socket=proxy.socket_path))
print(json.dumps({{"outcome": r.outcome.value, "stdout": r.stdout, "stderr": r.stderr[-2000:], "isolation": r.isolation, "caps": open("/proc/self/status").read().split("CapEff:")[1].split()[0]}}))
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root (to drop to the container's capabilities)"
)
def test_a_sandbox_host_container_without_net_admin_runs_the_relay():
    """The ``proposer-agent`` container is root with exactly the sandbox host's capabilities (the operator's
    ``SANDBOX_HOST_CAPABILITIES``): no NET_ADMIN over its pod's network. The sandbox's loopback comes up in a user namespace of its own."""
    work = Path(tempfile.mkdtemp(prefix="whale-egress-caps-"))
    try:
        script = work / "caller.py"
        script.write_text(SANDBOX_HOST_CALLER.format(repo=str(REPO)))
        from whale_operator.builders.pods import SANDBOX_HOST_CAPABILITIES

        caps = "-all," + ",".join("+" + c.lower() for c in SANDBOX_HOST_CAPABILITIES)
        done = subprocess.run(
            ["setpriv", f"--bounding-set={caps}", "--inh-caps=-all", sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=str(work),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert int(out["caps"], 16) & (1 << 12) == 0  # CAP_NET_ADMIN is not among the caller's
    assert out["outcome"] == "ok", out["stderr"]
    assert out["stdout"].splitlines() == ["HTTP/1.1 200 Connection established", "echo:hi"]
    # the status says where the user namespace is: only the network's (a root caller's mounts are the caller's)
    assert out["isolation"]["user_namespace"] is False and out["isolation"]["network_user_namespace"] is True


@pytest.mark.timeout(60)
def test_the_proxy_bounds_heads_and_idle_tunnels(echo: EchoServer):
    policy = EgressPolicy((f"localhost:{echo.port}",), ("localhost",))
    with EgressProxy(policy, idle_timeout_s=0.5) as proxy:
        with socket.socket(socket.AF_UNIX) as s:  # a head that never ends within the bound
            s.settimeout(20)
            s.connect(proxy.socket_path)
            s.sendall(b"CONNECT localhost:%d HTTP/1.1\r\nX: " % echo.port + b"a" * 70_000)
            assert s.recv(4096).startswith(b"HTTP/1.1 400")
        with socket.socket(socket.AF_UNIX) as s:  # a tunnel nobody uses is closed by the proxy
            s.settimeout(20)
            s.connect(proxy.socket_path)
            s.sendall(b"CONNECT localhost:%d HTTP/1.1\r\n\r\n" % echo.port)
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            assert s.recv(4096) == b""  # the proxy's end of file, after the idle time
    assert any(d.startswith("refused (400)") for d in proxy.decisions)
