"""What a domain plugin supplies. The core never names a domain; it talks to this interface.

A domain package registers an instance (or subclass) of :class:`Domain` under the ``whale.domains``
entry-point group. The harness runtime (``whale.harness``) extends what it needs from the domain:
its environment and tools, its verifier, its base harness h0 and the proposer's ``SKILL.md``.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from whale.spec import Data

SPLITS = ("weight", "harness", "test")


def default_data_root() -> Path:
    """$WHALE_DATA_DIR, else the ``shared/data`` folder beside the checkout."""
    env = os.environ.get("WHALE_DATA_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "shared" / "data", here / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    return here.parent / "shared" / "data"


def data_root(data: Data) -> Path:
    return Path(data.data_dir) if data.data_dir else default_data_root()


class Domain(abc.ABC):
    """A domain plugin. Subclasses set ``name`` and implement the split sizes; the harness runtime
    adds the episode machinery."""

    name: ClassVar[str]

    @abc.abstractmethod
    def split_sizes(self, data: Data) -> dict[str, int]:
        """|D_weight|, |D_harness|, |D_test| for these data settings. Cheap: `whale plan` calls it."""
