"""Where a run's untrusted code may get a privileged sandbox host: the cluster admin's decision, never the tenant's.

At ``spec.execution.sandbox.isolation: namespaces`` the pods that start ``whale.sandbox`` sandboxes (the harness host, the
code tool, the harness search of a ``cli`` proposer) run as root with ``SYS_ADMIN`` and AppArmor unconfined: not
even Pod Security *baseline*. Since a tenant chooses images and service accounts, rendering such a pod because a
WhaleRun asks for it would make creating a WhaleRun creating a privileged pod. So the operator renders sandbox hosts
only in the namespaces its admin lists (``WHALE_SANDBOX_HOST_NAMESPACES``, the chart's
``sandboxHosts.namespaces``; the namespace must also let such pods in: its ``pod-security.kubernetes.io/enforce``
label, the admin's second act). Elsewhere a run asking for ``namespaces`` runs at ``pod``: the harness pod and the
code tool are the walls (no credentials, no token, no egress), every pod restricted. A ``cli`` proposer cannot run
at ``pod`` (its agent needs egress, which the harness pod has not), so there it is refused, naming the fix.

``WHALE_SANDBOX_RUNTIME_CLASS`` (the chart's ``sandboxHosts.runtimeClassName``) names a sandboxed RuntimeClass
(gVisor, Kata) that every pod running untrusted code gets, at either level (``builders.with_sandbox_runtime``).
Pure: no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from whale_operator.cluster_spec import ClusterRunSpec

HOST_NAMESPACES_ENV = "WHALE_SANDBOX_HOST_NAMESPACES"
RUNTIME_CLASS_ENV = "WHALE_SANDBOX_RUNTIME_CLASS"
#: in :data:`HOST_NAMESPACES_ENV`: every namespace (a single-tenant cluster)
ANY_NAMESPACE = "*"


@dataclass(frozen=True)
class SandboxHostPolicy:
    """The namespaces whose runs may get privileged sandbox hosts (none by default) and the admin's sandboxed
    RuntimeClass for pods that run untrusted code (none: the cluster's default runtime)."""

    namespaces: tuple[str, ...] = ()
    runtime_class: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SandboxHostPolicy:
        env = os.environ if env is None else env
        listed = tuple(part.strip() for part in env.get(HOST_NAMESPACES_ENV, "").split(",") if part.strip())
        return cls(listed, env.get(RUNTIME_CLASS_ENV, "").strip() or None)

    def allows_hosts(self, namespace: str) -> bool:
        return ANY_NAMESPACE in self.namespaces or namespace in self.namespaces

    def effective(self, spec: ClusterRunSpec, namespace: str) -> tuple[ClusterRunSpec, list[tuple[str, str]]]:
        """The spec the run's children are rendered from (``namespaces`` becomes ``pod`` where the admin allows no
        sandbox host), and (field, message) problems that refuse the run (a ``cli`` proposer there)."""
        if spec.execution.sandbox.isolation != "namespaces" or self.allows_hosts(namespace):
            return spec, []
        if spec.experiment.harness_search.proposer.backend == "cli":
            return spec, [
                (
                    "spec.experiment.harnessSearch.proposer.backend",
                    f"a cli proposer's agent needs a privileged sandbox host, which this cluster's admins do not allow "
                    f"in namespace {namespace} (the operator's {HOST_NAMESPACES_ENV}, Helm value "
                    "sandboxHosts.namespaces); use a built-in agent backend (openai or anthropic), or ask them",
                )
            ]
        sandbox = spec.execution.sandbox.model_copy(update={"isolation": "pod"})
        return spec.with_sections(**{"sandbox": sandbox}), []
