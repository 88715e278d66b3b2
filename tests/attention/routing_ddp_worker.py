"""Worker for ``test_routing.py::test_two_process_ddp_keeps_the_centroids_identical``.

``python routing_ddp_worker.py TEXT OUT GRAD_ACCUM`` (alone, or under ``torchrun``): trains
``routing-tiny`` for 3 steps through :func:`effiformer.train.train` on the text file and writes
this process's k-means buffers to ``OUT/rank{RANK}.pt`` (and the initial ones to ``OUT/init.pt``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from effiformer import create_model
from effiformer.data import read_text
from effiformer.tasks import LMTask
from effiformer.train import TrainConfig, train


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.detach().clone() for n, b in model.named_buffers() if ".ema_" in n}


def main(text: str, out: str, grad_accum: str) -> None:
    torch.set_num_threads(1)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    model = create_model("routing-tiny", seq_len=64)
    if rank == 0:
        torch.save(_buffers(model), out_dir / "init.pt")
    task = LMTask(read_text(text), batch_size=8, seq_len=64, seed=0, eval_tokens=256)
    config = TrainConfig(
        steps=3, lr=3e-3, warmup=1, eval_every=None, progress=False, device="cpu",
        grad_accum=int(grad_accum),
    )  # fmt: skip
    train(model, task, config)
    torch.save(_buffers(model), out_dir / f"rank{rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
