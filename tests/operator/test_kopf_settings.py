"""The operator's kopf settings hold for its handlers: no change-detecting handler, so kopf need not build each
watched object's essence (``handlers.NoEssence``)."""

from __future__ import annotations

import gc

import kopf

from whale_operator import handlers


def test_no_handler_detects_changes_so_no_essence_is_built() -> None:
    registry = kopf.get_default_registry()
    daemons = [h.fn for h in registry._spawning.get_all_handlers()]
    assert handlers.whalerun_daemon in daemons, "the handlers are registered with the default registry"
    # NoEssence is right only while nothing registers on.create/update/resume/delete/field
    assert list(registry._changing.get_all_handlers()) == []
    assert handlers.NoEssence(prefix="whale.dev").build(body=kopf.Body({"spec": {"a": 1}})) == {}


def test_start_up_moves_its_objects_out_of_the_collectors_passes() -> None:
    registry = kopf.get_default_registry()
    startup = [h.fn for h in registry._activities.get_all_handlers()]
    assert handlers.settle_collector in startup, "registered as a start-up handler"
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        handlers.settle_collector()  # type: ignore[call-arg]  # kopf types it as an ActivityFn; it takes no argument
        assert gc.get_freeze_count() > 10_000  # the modules, kopf's registry, the schemas: all of start-up
    finally:
        gc.unfreeze()
