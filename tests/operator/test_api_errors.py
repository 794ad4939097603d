"""A child the API server refuses (RBAC's 403, an admission webhook's or validation's 422) is put in status -- the
ChildCreateFailed condition naming the child, the HTTP status and the server's words, and a Warning Event --
and retried with a growing back-off instead of every few seconds; the condition goes once the create succeeds.
The emulator plays the refusing API server (``refuse_creates``)."""

from __future__ import annotations

import itertools

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from whale.core import layout
from whale_operator.config import backoff_s

pytestmark = pytest.mark.timeout(120)

FORBIDDEN = (
    403,
    "Forbidden",
    'deployments.apps is forbidden: User "system:serviceaccount:whale-system:whale-operator" cannot create '
    'resource "deployments" in API group "apps"',
)


def test_backoff_doubles_up_to_its_cap():
    assert [backoff_s(n, 5.0, 300.0) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert backoff_s(10_000, 5.0, 300.0) == 300.0  # no overflow however long it fails


def condition(status: dict, type_: str) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def test_a_refused_child_is_in_status_backs_off_and_clears(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str, monkeypatch
):
    monkeypatch.setenv("WHALE_OPERATOR_ERROR_BACKOFF_S", "0.3")
    monkeypatch.setenv("WHALE_OPERATOR_MAX_BACKOFF_S", "2.4")  # over the conftest's 2 s (set after it)
    emulator, api = kube_cluster.emulator, kube_cluster.api
    kube_cluster.call(emulator.refuse_creates.__setitem__, "deployments", FORBIDDEN)
    try:
        with start_operator():
            run = make_run("refused")
            st = wait_for(lambda: condition(run.status(), "ChildCreateFailed"), what="ChildCreateFailed")
            assert st["status"] == "True" and st["reason"] == "Forbidden"
            assert st["message"].startswith("Deployment refused-vllm: HTTP 403: deployments.apps is forbidden")
            assert run.jobs() == []
            events = wait_for(
                lambda: [
                    e
                    for e in api.list("v1", "events", kube_namespace)
                    if e.get("reason") == "ChildCreateFailed" and e.get("involvedObject", {}).get("name") == "refused"
                ],
                what="the Warning Event",
            )
            assert events[0]["type"] == "Warning" and "HTTP 403" in events[0]["message"]

            # back-off: 0.3, 0.6, 1.2, 2.4, 2.4 s ... between tries, not one every 0.3 s: the next three tries (waited
            # for, no fixed window a loaded machine could fill with fewer) are each at least the first back-off
            # apart, and together at least three doublings; a slow machine only lengthens the gaps
            def tries() -> list[float]:
                return [at for plural, _, at in emulator.refused_creates if plural == "deployments"]

            tried = len(tries())  # >= 1: the condition and its Event came from a refusal
            times = wait_for(
                lambda: tries()[tried - 1 : tried + 3] if len(tries()) >= tried + 3 else None,
                timeout_s=60,
                what="three more tries",
            )
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert min(gaps) >= 0.9 * 0.3 and sum(gaps) >= 0.9 * (0.3 + 0.6 + 1.2), gaps
            assert (
                len(
                    {
                        e["metadata"]["name"]
                        for e in api.list("v1", "events", kube_namespace)
                        if e.get("reason") == "ChildCreateFailed"
                    }
                )
                == 1
            )  # the same refusal: one Event
            kube_cluster.call(emulator.refuse_creates.pop, "deployments")
            job = run.wait_job(timeout_s=15)
            assert job["metadata"]["name"] == "refused-eval-c00-s000000-start-1"
            wait_for(lambda: condition(run.status(), "ChildCreateFailed") is None, what="the condition to clear")
            assert api.get("apps/v1", "deployments", kube_namespace, "refused-vllm") is not None
    finally:
        kube_cluster.call(emulator.refuse_creates.clear)


def test_an_invalid_job_names_the_api_server_s_message(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    emulator = kube_cluster.emulator
    invalid = (422, "Invalid", 'Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required value')
    kube_cluster.call(emulator.refuse_creates.__setitem__, "jobs", invalid)
    try:
        with start_operator():
            run = make_run("invalid")
            wait_for(lambda: run.store.read_json_or_none(layout.serving_key("invalid")), what="the serving target")
            run.ack_serving()  # the sidecar's part: the first Job may start
            st = wait_for(lambda: condition(run.status(), "ChildCreateFailed"), what="ChildCreateFailed")
            assert st["reason"] == "Invalid"
            assert "Job invalid-eval-c00-s000000-start-1: HTTP 422" in st["message"]
            assert "containers[0].image: Required value" in st["message"]
            assert run.status().get("phase") != "Failed"  # a refusal is not a failed phase: no attempt was spent
    finally:
        kube_cluster.call(emulator.refuse_creates.clear)


def test_a_refused_auth_secret_is_named_too(start_operator, make_run, kube_cluster: EmulatedCluster):
    emulator = kube_cluster.emulator
    no = (
        403,
        "Forbidden",
        'secrets is forbidden: User "system:serviceaccount:whale-system:whale-operator" cannot create',
    )
    kube_cluster.call(emulator.refuse_creates.__setitem__, "secrets", no)
    try:
        with start_operator():
            run = make_run("nosecret")
            st = wait_for(lambda: condition(run.status(), "ChildCreateFailed"), what="ChildCreateFailed")
            assert st["message"].startswith("Secret nosecret-auth: HTTP 403: secrets is forbidden")
            assert run.jobs() == []  # no pod is made that would wait for a key that does not exist
    finally:
        kube_cluster.call(emulator.refuse_creates.clear)
