"""Train HAT's SuperTransformer on Multi30k En->De on a CPU: one SubTransformer sampled uniformly
per update (``SuperNetTask``), through the library's trainer (``effiformer.train.train``), with
run checkpoints (rerun the same command to resume exactly).

Recipe: HAT's optimiser (Adam betas (0.9, 0.98), no weight decay, no clipping), label smoothing
0.1, and the project's Multi30k schedule (``benchmarks/translation_multi30k.py``: peak lr 1e-3,
1000 warmup steps, inverse square root; ``--schedule cosine`` is HAT's WMT schedule over
``--steps``); dropout 0.1 at the SuperTransformer's width (rescaled per SubTransformer);
``--max-tokens`` 4096 padded tokens per update; a joint BPE vocabulary of 8000 trained on the
training split (kept in the run directory). Validation at the end (and every ``--eval-every``
steps): loss and greedy BLEU of the largest and the smallest SubTransformer on the first
``--eval-sentences`` of ``val``.

    python benchmarks/hat_supernet_multi30k.py --time-budget 3600 --out runs/hat-super   # the run
    python benchmarks/hat_supernet_multi30k.py --steps 6 --max-tokens 1024 \\
        --eval-sentences 20 --out /tmp/hat-super                                    # smoke

Writes the run directory ``OUT/`` (checkpoints, ``metrics.jsonl``) and ``OUT/results.jsonl``
(environment, setup, the final evaluation).

The parallel text is read from ``multi30k/`` under the data folder: ``--data DIR``, else
``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout (``--data`` may also name the
Multi30k folder itself, as before); without it the script stops at once with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from effiformer import get_config
from effiformer.bench.harness import environment
from effiformer.checkpoint import LATEST, resolve_checkpoint
from effiformer.config import parse_overrides
from effiformer.data import ParallelData
from effiformer.data.tokenizer import SubwordTokenizer
from effiformer.registry import build_model
from effiformer.tasks.supernet import SuperNetTask
from effiformer.tasks.translation import TranslationTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _data.add_data_flag(p, itself="the Multi30k folder")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--model", default="hat-multi30k-super")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=20_000, help="schedule length (and the cap)")
    p.add_argument("--time-budget", type=float, help="stop after this many seconds")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--schedule", default="inverse_sqrt", choices=("inverse_sqrt", "cosine"))
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-sentences", type=int, default=200)
    p.add_argument("--checkpoint-every", type=int, default=250)
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.data = str(
        _data.require_dataset(
            __file__,
            args.data,
            "multi30k",
            is_dataset=_data.parallel_folder(args.src, args.tgt),
            what=f"multi30k (train.{args.src}, train.{args.tgt})",
        )
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    resume = (out / LATEST).is_file()
    tokenizer = SubwordTokenizer.load(resolve_checkpoint(out)) if resume else None
    inner = TranslationTask(
        ParallelData(args.data, args.src, args.tgt), tokenizer, vocab_size=args.vocab_size,
        max_tokens=args.max_tokens, seed=args.seed, eval_sentences=args.eval_sentences,
        data_spec={"path": str(Path(args.data).resolve())},
    )  # fmt: skip
    task = SuperNetTask(inner, seed=args.seed)
    base = get_config(args.model)
    config = get_config(args.model, vocab_size=inner.tokenizer.vocab_size,
                        **parse_overrides(base, args.set))  # fmt: skip
    torch.manual_seed(args.seed)
    model = build_model(config)
    cfg = TrainConfig(
        steps=args.steps, optimizer="adam", lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
        weight_decay=0.0, warmup=args.warmup, schedule=args.schedule, min_lr_ratio=1e-4,
        clip=None, seed=args.seed, device="cpu", time_budget=args.time_budget,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, out_dir=str(out),
        resume=str(out) if resume else None, model_name=args.model, log_every=10,
    )  # fmt: skip
    t0 = time.monotonic()
    history = train(model, task, cfg)
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps({"kind": "environment", **env, "loadavg": os.getloadavg(),
                            "argv": sys.argv[1:] if argv is None else argv}) + "\n")  # fmt: skip
        f.write(json.dumps({
            "kind": "setup", "model": args.model, "config": config.to_dict(),
            "params": model.num_params(), "train_pairs": len(inner.train),
            "train_config": cfg.to_dict(),
        }) + "\n")  # fmt: skip
        f.write(json.dumps({
            "kind": "final", "step": history.step, "start_step": history.start_step,
            "stop_reason": history.stop_reason, "seconds": time.monotonic() - t0,
            "last_loss": history.losses[-1] if history.losses else None,
            "eval": history.evals[-1] if history.evals else None,
            "checkpoint": history.checkpoint,
        }) + "\n")  # fmt: skip
    e = history.evals[-1] if history.evals else {}
    print(
        f"step {history.step} ({history.stop_reason}): val loss largest "
        f"{e.get('val_largest_loss', float('nan')):.3f} smallest "
        f"{e.get('val_smallest_loss', float('nan')):.3f}; greedy BLEU largest "
        f"{e.get('val_largest_bleu', float('nan')):.2f} smallest "
        f"{e.get('val_smallest_bleu', float('nan')):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
