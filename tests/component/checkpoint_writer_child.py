"""Child process of ``test_checkpoint_writer``'s kill tests: write a complete checkpoint of step 1, then start
the background write of step 2 through a store that stops (forever) at ``--block`` ("weights": after the
checkpoint's first file, before its marker; "state": in the resume state's optimiser upload, after the
checkpoint of step 2 is complete), touch ``--ready`` and keep training until it is killed.

    python -m tests.component.checkpoint_writer_child STORE_DIR MODEL_DIR READY_FILE weights|state
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from whale.core import layout
from whale.rsft.checkpoint_writer import CheckpointWriter
from whale.store.local import LocalStore

RUN, PHASE = "kill-test", "c01-weight"


class StallingStore(LocalStore):
    """Test double around the real local store: one upload never returns (a writer stuck mid-write)."""

    def __init__(self, root: Path, stall_prefix: str, ready: Path):
        super().__init__(root)
        self.stall_prefix = stall_prefix
        self.ready = ready
        self.stalled = False

    def upload_file(self, path: Path, key: str) -> None:
        super().upload_file(path, key)  # one file of the folder is there: the write is half done
        self._stall_at(key)

    @contextmanager
    def writing(self, key: str) -> Iterator[BinaryIO]:
        with super().writing(key) as fh:
            yield fh
            self._stall_at(key)  # the bytes written, not yet in place (the optimiser state is streamed)

    def _stall_at(self, key: str) -> None:
        if key.startswith(self.stall_prefix) and not self.stalled:
            self.stalled = True
            self.ready.write_text("stalled\n")
            threading.Event().wait()


def main(store_dir: str, model_dir: str, ready: str, block: str) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stall = layout.checkpoint_prefix(RUN, 2) if block == "weights" else f"{layout.state_prefix(RUN, PHASE)}/step-000002"
    store = StallingStore(Path(store_dir), stall + "/", Path(ready))
    writer = CheckpointWriter(store, RUN, PHASE, background=True)
    for step in (1, 2):
        ids = torch.randint(0, model.config.vocab_size, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        writer.save(step, model, tokenizer, optimizer.state_dict, {"cursor": step})
        if step == 1:
            writer.wait()
    while True:  # the trainer goes on to the next step's sampling; the parent kills it here
        threading.Event().wait(1.0)


if __name__ == "__main__":
    main(*sys.argv[1:5])
