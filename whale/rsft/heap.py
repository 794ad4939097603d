"""Keep Python's full garbage collections out of a weight phase's steps.

A weight phase's process holds hundreds of thousands of long-lived Python objects (torch, transformers, the
model's modules, torch.compile's graphs and guards, the sampler's clients) and every step allocates as many
short-lived ones (episodes, messages, token lists). CPython's oldest generation is collected when enough
objects have survived into it, and that full collection walks every tracked object: ~0.1 s per 400 k
objects on a 2-core machine, paid inside whichever step triggers it (while the step's rollouts wait on the
event loop, or between SFT micro-batches).

:func:`freeze_long_lived` collects once and then moves every surviving object to the permanent generation
(``gc.freeze``), which later collections skip, as vLLM does after its start-up. Objects allocated afterwards
are collected as before; what is frozen is never collected, which is right only for a process that exists
to run the phase (its long-lived objects live until it exits). So it does nothing until
:func:`freeze_in_this_process` says so: ``python -m whale.workloads`` does, a library caller (a test, a
notebook) does not. The weight loop calls it before its first step and after it (the first step compiles
the layers and opens the sampler's connections).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

_enabled = False


def freeze_in_this_process(enabled: bool = True) -> None:
    """This process runs one workload and exits: let :func:`freeze_long_lived` freeze."""
    global _enabled  # noqa: PLW0603 - a property of the process, set once by its entrypoint
    _enabled = enabled


def freeze_long_lived() -> float:
    """Collect, then freeze what survived (when enabled); returns the seconds it took."""
    if not _enabled:
        return 0.0
    start = time.perf_counter()
    gc.collect()
    gc.freeze()
    seconds = time.perf_counter() - start
    log.info("froze %d long-lived objects out of garbage collection in %.2f s", gc.get_freeze_count(), seconds)
    return seconds
