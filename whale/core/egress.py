"""Which hosts an untrusted program may reach through the egress proxy: an allow-list of names. Pure: no I/O.

The ``cli`` proposer's agent (``spec.experiment.harnessSearch.proposer.network: proxy``) has a network namespace with
loopback only; its one way out is an HTTP ``CONNECT`` proxy outside the sandbox (:mod:`whale.sandbox.egress`), which
asks this module two questions: may this ``CONNECT host:port`` be opened at all (:meth:`EgressPolicy.target`: the
name is on the list, exactly; never an IP literal; the port is the entry's), and may the address the proxy resolved
the name to be dialled (:meth:`EgressPolicy.address`: a public address, or any address for a name the spec's author
listed in ``allowPrivateHosts``). The proxy then connects to the very address it checked, so a name that resolves to
a public address for the check and to 127.0.0.1 for the connection (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from urllib.parse import urlsplit

#: the port an entry without ``:port`` allows (TLS through ``CONNECT``)
DEFAULT_PORT = 443
#: ``allowHosts`` when the spec names none: the API of the agent the examples run (Claude Code)
DEFAULT_ALLOW_HOSTS = ("api.anthropic.com",)
#: a DNS name, lower case, at most 253 characters, whose last label is not all digits (so no IPv4 literal in any of
#: its spellings passes: ``127.1``, ``0x7f000001`` and ``2130706433`` all fail); an IPv6 literal has ``:`` or ``[``
HOST_NAME_RE = re.compile(
    r"(?=.{1,253}\Z)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*(?=[a-z0-9-]*[a-z])[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
)
#: an allow-list entry, as the spec's schema checks it (RE2, for the CRD too): a host name whose last label has a
#: letter (so no IPv4 or IPv6 literal), optionally ``:port``; :func:`parse_entry` is the whole check
ENTRY_PATTERN = r"^([A-Za-z0-9-]{1,63}\.)*[A-Za-z0-9-]*[A-Za-z][A-Za-z0-9-]*\.?(:[0-9]{1,5})?$"
#: a host name of ``allowPrivateHosts``: the same without the port
NAME_PATTERN = r"^([A-Za-z0-9-]{1,63}\.)*[A-Za-z0-9-]*[A-Za-z][A-Za-z0-9-]*\.?$"


def service_target(url: str) -> tuple[str, int]:
    """The (host, port) of a tool service's ``http://host:port`` URL (an IPv6 host without its brackets)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"a tool service URL must be http://host:port, got {url!r}")
    return parts.hostname.lower(), parts.port or 80


class EgressRefused(ValueError):
    """A connection the policy refuses; the message says why (the proxy answers it and logs it)."""


def host_name(text: str) -> str:
    """``text`` as a canonical host name (lower case, no trailing dot); an IP literal or a malformed name raises."""
    name = text.strip().lower().removesuffix(".")
    if name.startswith("[") or ":" in name:
        raise EgressRefused(f"{text!r} is an IP literal; only host names may be allow-listed or asked for")
    try:
        socket.inet_aton(name)  # every spelling the C library reads as IPv4 (127.1, 0x7f000001, 2130706433)
    except OSError:
        pass
    else:
        raise EgressRefused(f"{text!r} is an IP literal; only host names may be allow-listed or asked for")
    if not HOST_NAME_RE.fullmatch(name):
        raise EgressRefused(
            f"{text!r} is not a host name (letters, digits, '-' and '.'; the last label not all digits)"
        )
    return name


def parse_entry(entry: str) -> tuple[str, int]:
    """An allow-list entry ``host`` or ``host:port`` as (host name, port)."""
    host, sep, port_text = entry.strip().rpartition(":") if entry.count(":") == 1 else (entry, "", "")
    if not sep:
        host, port = entry, DEFAULT_PORT
    elif not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise EgressRefused(f"{entry!r}: the port must be a number in 1..65535")
    else:
        port = int(port_text)
    return host_name(host), port


def public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is a global unicast address: not loopback, link-local (cloud metadata 169.254.169.254),
    private (RFC 1918, unique-local; a cluster's pod and service ranges are among these), shared (100.64/10),
    reserved, multicast or unspecified; an IPv4-mapped IPv6 address is judged as the IPv4 one it carries."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclasses.dataclass(frozen=True)
class EgressPolicy:
    """The allow-list: ``hosts`` (``name`` or ``name:port``, exact names, no wildcard, no IP literal) and
    ``private_hosts`` (names of ``hosts`` that may resolve to non-public addresses: the spec author's explicit
    opt-in, e.g. a model server inside the cluster)."""

    hosts: tuple[str, ...] = ()
    private_hosts: tuple[str, ...] = ()
    #: the run's own tool services (``http://host:port`` URLs the prototyping kit lists), named by the trusted side,
    #: not the spec: each exact ``host:port`` is allowed at whatever address it has (loopback under ``whale run``, a
    #: cluster Service's), an IP literal included
    services: tuple[str, ...] = ()
    _services: frozenset[tuple[str, int]] = dataclasses.field(init=False, repr=False, compare=False)
    _allowed: frozenset[tuple[str, int]] = dataclasses.field(init=False, repr=False, compare=False)
    _private: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for field in ("hosts", "private_hosts", "services"):
            value = getattr(self, field)
            if isinstance(value, str):
                raise ValueError(f"EgressPolicy.{field} must be a sequence of names, got the string {value!r}")
            object.__setattr__(self, field, tuple(value))
        try:
            allowed = {parse_entry(e) for e in self.hosts}
            private = {host_name(h) for h in self.private_hosts}
        except EgressRefused as exc:
            raise ValueError(f"egress allow-list: {exc}") from None
        names = {h for h, _ in allowed}
        if private - names:
            raise ValueError(f"egress allow-list: private hosts {sorted(private - names)} are not among the hosts")
        object.__setattr__(self, "_services", frozenset(service_target(url) for url in self.services))
        object.__setattr__(self, "_allowed", frozenset(allowed))
        object.__setattr__(self, "_private", frozenset(private))

    def target(self, authority: str) -> tuple[str, int]:
        """The (host, port) of a ``CONNECT`` request's ``host:port`` if the list allows it, else :class:`EgressRefused`."""
        host_text, sep, port_text = authority.rpartition(":")
        if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise EgressRefused(f"CONNECT {authority!r}: expected host:port")
        service = (host_text.strip("[]").lower(), int(port_text))
        if service in self._services:
            return service
        host, port = host_name(host_text), int(port_text)
        if (host, port) not in self._allowed:
            raise EgressRefused(f"CONNECT {host}:{port}: not on the allow-list")
        return host, port

    def address(self, host: str, address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The resolved ``address`` of allow-listed ``host`` if it may be dialled, else :class:`EgressRefused`."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if not public(ip) and host not in self._private and host not in {h for h, _ in self._services}:
            raise EgressRefused(
                f"CONNECT {host}: it resolves to {ip}, not a public address (loopback, link-local, private or "
                "cluster range); list the name in allowPrivateHosts if that is meant"
            )
        return ip
