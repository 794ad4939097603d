"""Domains are plugins found through the entry-point group; load failures are reported, not dropped."""

from __future__ import annotations

import pytest

from whale import plugins


def test_plugin_domain_is_found_and_loaded(counting_domain):
    assert "counting" in plugins.available()
    d = plugins.load("counting")
    assert d.name == "counting"


def test_unknown_domain_error_lists_known(counting_domain):
    with pytest.raises(plugins.UnknownDomainError, match="registered domains: .*counting"):
        plugins.load("nope")


def test_a_plugin_that_fails_to_import_is_reported(counting_domain, caplog):
    with pytest.raises(plugins.DomainLoadError, match="'broken' is registered but failed to import"):
        plugins.load("broken")
    assert "domain broken failed to load" in caplog.text
