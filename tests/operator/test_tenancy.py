"""A run's store on a shared cluster: namespace and UID in the prefix, adoption only within the namespace,
and the platform team's allow-list of stores and endpoints."""

from __future__ import annotations

import pytest

from whale_operator.tenancy import StorePolicy, run_store_uri


def test_namespace_and_uid_make_the_store_of_one_object():
    a = run_store_uri("s3://whale/runs-root", "team-a", "demo", "uid-1")
    assert a == "s3://whale/runs-root/team-a/demo.uid-1"
    # the same name in another namespace, and the same name re-created (new UID): other stores
    assert run_store_uri("s3://whale/runs-root", "team-b", "demo", "uid-1") != a
    assert run_store_uri("s3://whale/runs-root/", "team-a", "demo", "uid-2") != a
    # resumeFrom adopts the earlier object's store, in the object's own namespace only
    assert run_store_uri("s3://whale/runs-root", "team-a", "demo", "uid-2", resume_from="uid-1") == a
    assert run_store_uri("s3://whale/runs-root", "team-b", "demo", "uid-9", resume_from="uid-1") != a


def test_a_run_without_identity_has_no_store():
    with pytest.raises(ValueError):
        run_store_uri("s3://whale", "team-a", "demo", "")


def test_the_allow_list_names_the_field_and_the_setting():
    policy = StorePolicy.from_env(
        {"WHALE_ALLOWED_STORES": "s3://whale, s3://shared/team-a", "WHALE_ALLOWED_S3_ENDPOINTS": "minio.whale.svc:9000"}
    )
    assert policy.problems("s3://whale/x", "minio.whale.svc:9000") == []
    assert policy.problems("s3://shared/team-a", "minio.whale.svc:9000") == []
    ((field, message),) = policy.problems("s3://whalex/x", "minio.whale.svc:9000")  # a path boundary, not a prefix
    assert field == "spec.execution.storage.uri" and "WHALE_ALLOWED_STORES" in message
    ((field, message),) = policy.problems("s3://shared/team-b", "minio.whale.svc:9000")
    assert field == "spec.execution.storage.uri"
    ((field, message),) = policy.problems("s3://whale", "attacker.example:443")
    assert field == "spec.execution.storage.endpoint" and "WHALE_ALLOWED_S3_ENDPOINTS" in message
    assert policy.problems("s3://whale/x", "http://minio.whale.svc:9000/") == []  # the same endpoint, with a scheme


def test_the_endpoint_allow_list_is_on_by_default_and_star_turns_it_off():
    """Issue #29 item 4: unset, no S3 endpoint is allowed (the operator calls what a tenant names); ``*`` is the
    admin's explicit single-tenant choice. A folder store names no endpoint and is not concerned."""
    ((field, message),) = StorePolicy.from_env({}).problems("s3://anything", "anywhere:1")
    assert field == "spec.execution.storage.endpoint"
    assert "none is allowed until the cluster's admins list theirs" in message and "allowedS3Endpoints" in message
    assert StorePolicy.from_env({"WHALE_ALLOWED_S3_ENDPOINTS": " "}).problems("s3://a", "anywhere:1") != []
    assert StorePolicy.from_env({}).problems("file:///runs/x", None) == []
    assert StorePolicy.from_env({"WHALE_ALLOWED_S3_ENDPOINTS": "*"}).problems("s3://anything", "anywhere:1") == []
