"""The operator's Kubernetes client against the API emulator: each worker thread keeps one connection of its own
(``whale_operator.transport``), and the pool size it is given is the SDK pool's (the HTTP proxy path's)."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from tests.fixtures.kube import EmulatedCluster
from whale_operator.config import worker_threads
from whale_operator.kube import KubeClient


@pytest.mark.timeout(60)
def test_each_worker_thread_keeps_one_connection_of_its_own(
    kube_cluster: EmulatedCluster, kube_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    monkeypatch.setenv("WHALE_OPERATOR_WORKERS", "24")
    workers = worker_threads()
    kube = KubeClient.from_environment(pool_size=workers)
    try:
        pool = kube.api.rest_client.pool_manager.connection_from_url(kube_cluster.url)
        assert workers == 24 and pool.pool.maxsize == 24  # the SDK's default here would be 5 per CPU
        transport = kube._transport
        assert transport is not None
        barrier = threading.Barrier(workers, timeout=30)

        def one(_: int) -> int:
            barrier.wait()  # all in flight together: each on its own connection
            return len(kube.list("batch/v1", "Job", kube_namespace))

        with concurrent.futures.ThreadPoolExecutor(workers) as threads:
            assert list(threads.map(one, range(workers))) == [0] * workers
            assert transport.opened == workers
            # the same threads again: every connection is kept and reused, none opened
            assert list(threads.map(one, range(workers))) == [0] * workers
            assert transport.opened == workers
        kube.list("batch/v1", "Job", kube_namespace)  # a new thread: one more; the ended threads' are closed
        assert transport.opened == workers + 1 and len(transport._open) == 1
    finally:
        kube.close()


@pytest.mark.parametrize("bad", ["0", "-3", "many", "2.5", "100000"])
def test_worker_threads_refuses_nonsense(bad: str) -> None:
    # 100000: a thread and a connection each, for reconciles that queue on one interpreter lock anyway
    assert worker_threads({}) == 16
    with pytest.raises(ValueError, match=r"WHALE_OPERATOR_WORKERS='.*': give a whole number from 1 to 256 \(16 when"):
        worker_threads({"WHALE_OPERATOR_WORKERS": bad})


@pytest.mark.timeout(60)
def test_the_credentials_are_reloaded_at_most_every_30_s_not_before_each_request(
    kube_cluster: EmulatedCluster, kube_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue #33: the kubeconfig loader's hook put itself back in place of the throttle at its first call, so every
    # later request reloaded the credentials (and read the whole environment for proxies)
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    kube = KubeClient.from_environment()
    try:
        cfg = kube.api.configuration
        throttle = cfg.refresh_api_key_hook
        kube.list("batch/v1", "Job", kube_namespace)  # the first request loads the token (the kubeconfig's)
        assert cfg.api_key["BearerToken"] == "Bearer emulator"
        cfg.api_key["BearerToken"] = "not-reloaded"  # a reload would put the kubeconfig's token back
        for _ in range(3):
            kube.list("batch/v1", "Job", kube_namespace)
        assert cfg.api_key["BearerToken"] == "not-reloaded"
        assert cfg.refresh_api_key_hook is throttle
    finally:
        kube.close()
