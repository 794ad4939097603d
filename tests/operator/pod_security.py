"""The restricted Pod Security Standard, as a checker over pod specs (the rules of
https://kubernetes.io/docs/concepts/security/pod-security-standards/, baseline and restricted, latest).

Written here because nothing on PyPI evaluates it offline; the rules are few and each is one line below.
``violations(obj)`` takes any object with a pod template (Pod, Deployment, Job, StatefulSet, DaemonSet,
CronJob) and returns what the API server's ``pod-security.kubernetes.io/enforce: restricted`` would refuse.
"""

from __future__ import annotations

from typing import Any

#: capabilities baseline lets a container add (restricted: only NET_BIND_SERVICE)
BASELINE_CAPS = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    kind = obj.get("kind")
    spec = obj.get("spec", {})
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet", "ReplicaSet"):
        return spec["template"]["spec"]
    return None


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template of ``obj``: :func:`pod_spec`'s one, or each replicated Job's of a JobSet."""
    if obj.get("kind") == "JobSet":
        return [r["template"]["spec"]["template"]["spec"] for r in obj["spec"]["replicatedJobs"]]
    pod = pod_spec(obj)
    return [] if pod is None else [pod]


def violations(obj: dict[str, Any]) -> list[str]:
    """What ``enforce: restricted`` would refuse of every pod template of ``obj`` (a JobSet's included)."""
    return [v for pod in pod_specs(obj) for v in pod_violations(pod)]


def pod_violations(pod: dict[str, Any]) -> list[str]:
    out: list[str] = []
    psc = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            out.append(f"{flag}: true")
    for vol in pod.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']}: {sorted(kinds - RESTRICTED_VOLUMES)} is not allowed")
    for sysctl in psc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl['name']}")
    containers = [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]
    for c in containers:
        sc = c.get("securityContext", {})
        where = f"container {c['name']}"
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{where}: capabilities must drop ALL")
        added = set(caps.get("add", [])) - {"NET_BIND_SERVICE"}
        if added:
            out.append(f"{where}: adds capabilities {sorted(added)}")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"{where}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost (pod or container)")
        apparmor = sc.get("appArmorProfile", psc.get("appArmorProfile", {})).get("type")
        if apparmor == "Unconfined":
            out.append(f"{where}: appArmorProfile Unconfined")
        selinux = sc.get("seLinuxOptions", psc.get("seLinuxOptions", {}))
        if (
            selinux.get("user")
            or selinux.get("role")
            or selinux.get("type")
            not in (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
        ):
            out.append(f"{where}: seLinuxOptions")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}: procMount")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                out.append(f"{where}: hostPort {port['hostPort']}")
    return out
