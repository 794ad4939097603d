"""A test plugin domain (a double: it has sizes but no episodes), registered the way every
domain is — an installed distribution with a ``whale.domains`` entry point — to prove the
registry and to drive the runner with simulated workloads."""

from __future__ import annotations


class CountingDomain:
    name = "counting"

    def split_sizes(self, data) -> dict[str, int]:
        weight = 256 * 10  # 10 steps per epoch at the default promptsPerStep
        if data.weight_size:
            weight = min(weight, data.weight_size)
        return {"weight": weight, "harness": min(4, data.harness_size), "test": 10}


DOMAIN = CountingDomain()


class BrokenImport:  # referenced by the 'broken' entry point, whose module import fails
    pass
