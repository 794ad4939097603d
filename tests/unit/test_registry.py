"""Domains are plugins found through the entry-point group; load failures are reported, not dropped."""

from __future__ import annotations

import pytest

from whale import domains


def test_plugin_domain_is_found_and_loaded(counting_domain):
    assert "counting" in domains.available()
    d = domains.load("counting")
    assert d.name == "counting"


def test_unknown_domain_error_lists_known(counting_domain):
    with pytest.raises(domains.UnknownDomainError, match="registered domains: .*counting"):
        domains.load("nope")


def test_a_plugin_that_fails_to_import_is_reported(counting_domain, caplog):
    with pytest.raises(domains.DomainLoadError, match="'broken' is registered but failed to import"):
        domains.load("broken")
    assert "domain broken failed to load" in caplog.text
