"""whale.rsft.heap: a workload process freezes its long-lived objects out of full garbage collections;
a library caller (this test process) is left alone. The freezing itself runs in a subprocess so that it
cannot change this process's collector."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from whale.rsft import heap

FREEZE = textwrap.dedent(
    """
    import gc, weakref
    from whale.rsft import heap

    class Node:
        pass

    alive = Node()
    cycle = Node()
    cycle.me = cycle  # garbage only a collection frees
    dead = weakref.ref(cycle)
    del cycle
    heap.freeze_in_this_process()
    heap.freeze_long_lived()
    assert dead() is None, "the cycle was frozen instead of collected"
    assert gc.get_freeze_count() > 0
    tracked = [o for generation in range(3) for o in gc.get_objects(generation)]
    assert not any(o is alive for o in tracked), "a live object is still walked by full collections"
    later = Node()
    later.me = later
    assert any(o is later for o in gc.get_objects(0)), "objects made after the freeze are collected as before"
    print("frozen", gc.get_freeze_count())
    """
)


def test_a_library_caller_is_left_alone():
    before = gc.get_freeze_count()
    assert heap.freeze_long_lived() == 0.0
    assert gc.get_freeze_count() == before


def test_a_workload_process_collects_then_freezes_what_survived():
    done = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 1000  # the interpreter's and the imports' objects, not just ours
