"""Funnel-Transformer vs a dense encoder of about the same FLOPs: MLM pretraining under one CPU
budget, then GLUE SST-2 and RTE fine-tuning; dev scores side by side.

    python benchmarks/funnel_glue.py --out runs/funnel_glue            # ~17 min on a shared 2-core CPU
    python benchmarks/funnel_glue.py --pretrain-seconds 30 --finetune-seconds 20   # smoke run

Pretraining text (all offline, under the data folder; English, unlike the embedded stdlib code
corpus): the SST-2 *train* sentences, tinyshakespeare and the PTB train split; validation: the
first lines of the PTB valid split. One WordPiece tokenizer (8,000 ids) is trained on that text
and shared by both models. FLOPs are counted with :func:`effiformer.flops.counted_flops` on one
MLM forward of a (1, seq_len) batch, the dense depth is picked to match the Funnel's FLOPs,
and each model gets the same wall-clock budget (steps are set from a measured step time so the
cosine schedule completes; the time budget also caps the run). Results go to stdout and to
``OUT/results.jsonl`` as JSON lines with the environment.

The committed results (``benchmarks/results/funnel_glue*.jsonl``) were counted with a plain
``FlopCounterMode``, which has no formula for the CPU flash-attention kernel the dense encoder
calls, so their dense FLOPs leave its attention out: 0.971x the Funnel's at d 256 / T 128 and at
d 128 / T 64 as recorded, 1.030x and 1.017x with the kernel counted. The depth picked is 7
layers either way (recounted 2026-12-03, forward only, nothing retrained).

The data folder: ``--data DIR``, else ``$EFFIFORMER_DATA``, else ``../shared/data`` beside the
checkout; it must hold ``glue/SST-2``, ``glue/RTE``, ``tinyshakespeare/input.txt`` and ``ptb/``
(checked first: one line on stderr naming what is missing, exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from effiformer.data.tokenizer import SubwordTokenizer
from effiformer.flops import counted_flops
from effiformer.models.funnel import FunnelConfig, FunnelForMaskedLM
from effiformer.models.transformer import Transformer, VanillaConfig
from effiformer.tasks.glue import GlueTask
from effiformer.tasks.mlm import MLMTask, read_texts
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
#: What the script reads under the data folder (checked before any work).
NEEDS = [
    "glue/SST-2/train.tsv",
    "glue/SST-2/dev.tsv",
    "glue/RTE/train.tsv",
    "glue/RTE/dev.tsv",
    "tinyshakespeare/input.txt",
    "ptb/ptb.train.txt",
    "ptb/ptb.valid.txt",
]


def environment() -> dict:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sha = None
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "git": sha,
    }


def pretraining_texts(data: Path) -> tuple[list[str], list[str], dict]:
    sst = [
        line.split("\t")[0].strip()
        for line in (data / "glue/SST-2/train.tsv").read_text().split("\n")[1:]
        if line.strip()
    ]
    shakespeare = read_texts(data / "tinyshakespeare/input.txt")
    ptb = read_texts(data / "ptb/ptb.train.txt")
    ptb = [line.replace("<unk>", "[UNK]") for line in ptb]
    valid = [line.replace("<unk>", "[UNK]") for line in read_texts(data / "ptb/ptb.valid.txt")]
    train_texts = sst + shakespeare + ptb
    info = {
        "sst2_train_lines": len(sst),
        "shakespeare_lines": len(shakespeare),
        "ptb_lines": len(ptb),
    }
    return train_texts, valid[:1000], info


def mlm_flops(model: torch.nn.Module, seq_len: int) -> int:
    ids = torch.randint(5, model.config.vocab_size, (1, seq_len))
    ids[:, 0], ids[:, -1] = 2, 3
    types = torch.zeros_like(ids)
    types[:, 0] = 2
    model.eval()

    def forward() -> None:
        with torch.no_grad():
            if isinstance(model, FunnelForMaskedLM):
                model(ids, token_type_ids=types)
            else:
                model(ids)

    flops = counted_flops(forward)
    model.train()
    return flops


def seconds_per_step(make_model, task, lr: float, probe_steps: int) -> float:
    """Wall time of one training step (forward, backward, AdamW), measured on a throwaway copy;
    the first step is excluded and the task's data position is restored afterwards."""
    state = task.state_dict()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = task.train_batches(model)
    times = []
    for _ in range(probe_steps + 1):
        t = time.perf_counter()
        out = task.forward(model, next(batches), None)
        out.total_loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    task.load_state_dict(state)
    return sum(times[1:]) / probe_steps


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    env = environment()

    def emit(record: dict) -> None:
        record = {**record, "env": env, "command": " ".join(sys.argv)}
        line = json.dumps(record)
        print(line, flush=True)
        with open(results, "a") as f:
            f.write(line + "\n")

    t0 = time.time()
    train_texts, valid_texts, info = pretraining_texts(Path(args.data))
    tok_path = out / "tokenizer.json"
    if tok_path.is_file():
        tokenizer = SubwordTokenizer.load(tok_path)
    else:
        tokenizer = SubwordTokenizer.train(train_texts, vocab_size=args.vocab_size)
        tokenizer.save(tok_path)
    task = MLMTask.from_texts(
        train_texts,
        valid_texts,
        tokenizer,
        batch_size=args.batch,
        seq_len=args.seq_len,
        seed=args.seed,
        eval_windows=args.eval_windows,
        name="sst2-train+tinyshakespeare+ptb-train",
    )
    emit(
        {
            "kind": "data",
            **info,
            "tokens": {k: int(v.numel()) for k, v in task.splits.items()},
            "vocab_size": tokenizer.vocab_size,
            "seconds": time.time() - t0,
        }
    )

    v = tokenizer.vocab_size
    funnel_cfg = FunnelConfig(
        vocab_size=v,
        dim=args.dim,
        n_heads=args.heads,
        ffn_dim=4 * args.dim,
        block_sizes=(2, 2, 2),
        n_decoder_layers=2,
        seq_len=args.seq_len,
        dropout=0.1,
        attn_dropout=0.1,
        init_std=0.02,
    )

    def dense_cfg(n_layers: int) -> VanillaConfig:
        return VanillaConfig(
            vocab_size=v,
            dim=args.dim,
            n_heads=args.heads,
            n_layers=n_layers,
            seq_len=args.seq_len,
            causal=False,
            dropout=0.1,
        )

    funnel_flops = mlm_flops(FunnelForMaskedLM(funnel_cfg), args.seq_len)
    options = {n: mlm_flops(Transformer(dense_cfg(n)), args.seq_len) for n in range(1, 13)}
    depth = min(options, key=lambda n: abs(options[n] - funnel_flops))
    makers = {
        "funnel-b2-2-2": lambda: FunnelForMaskedLM(funnel_cfg),
        f"dense-l{depth}": lambda: Transformer(dense_cfg(depth)),
    }
    flops = {"funnel-b2-2-2": funnel_flops, f"dense-l{depth}": options[depth]}
    for name, make in makers.items():
        emit(
            {
                "kind": "model",
                "model": name,
                "params": sum(p.numel() for p in make().parameters()),
                "mlm_forward_flops": flops[name],
                "flops_ratio_to_funnel": flops[name] / funnel_flops,
                "seq_len": args.seq_len,
            }
        )

    for name, make in makers.items():
        torch.manual_seed(args.seed)
        sps = seconds_per_step(make, task, args.lr, 3)
        steps = max(10, int(args.pretrain_seconds / sps))
        torch.manual_seed(args.seed)
        model = make()
        hist = train(
            model,
            task,
            TrainConfig(
                steps=steps,
                lr=args.lr,
                warmup=max(1, steps // 10),
                time_budget=args.pretrain_seconds,
                eval_every=None,
                progress=False,
                seed=args.seed,
            ),
        )
        ev = hist.evals[-1]
        emit(
            {
                "kind": "pretrain",
                "model": name,
                "steps": hist.step,
                "planned_steps": steps,
                "stop": hist.stop_reason,
                "seconds": hist.seconds,
                "batch": args.batch,
                "seq_len": args.seq_len,
                "final_train_loss": hist.losses[-1],
                "val_mlm_loss": ev["val_mlm_loss"],
                "val_mlm_accuracy": ev["val_mlm_accuracy"],
            }
        )
        for glue_task, folder in (("sst2", "SST-2"), ("rte", "RTE")):
            gtask = GlueTask(
                glue_task,
                Path(args.data) / "glue" / folder,
                tokenizer,
                max_len=args.seq_len,
                batch_size=args.ft_batch,
                seed=args.seed,
            )

            def make_clf(model=model, gtask=gtask, make=make):
                torch.manual_seed(args.seed)
                # A copy of the pretrained weights for each task.
                clone = make()
                clone.load_state_dict(model.state_dict())
                return clone.sequence_classifier(gtask.spec.num_labels)

            sps = seconds_per_step(make_clf, gtask, args.ft_lr, 3)
            steps = max(10, int(args.finetune_seconds / sps))
            hist = train(
                make_clf(),
                gtask,
                TrainConfig(
                    steps=steps,
                    lr=args.ft_lr,
                    warmup=max(1, steps // 10),
                    weight_decay=0.01,
                    time_budget=args.finetune_seconds,
                    eval_every=None,
                    progress=False,
                    seed=args.seed,
                ),
            )
            ev = {k[4:]: v for k, v in hist.evals[-1].items() if k.startswith("val_")}
            emit(
                {
                    "kind": "finetune",
                    "model": name,
                    "task": glue_task,
                    "steps": hist.step,
                    "planned_steps": steps,
                    "stop": hist.stop_reason,
                    "seconds": hist.seconds,
                    "batch": args.ft_batch,
                    "epochs": hist.step * args.ft_batch / len(gtask.examples("train")),
                    "dev": ev,
                }
            )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _data.add_data_flag(p)
    p.add_argument("--out", default="runs/funnel_glue")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--pretrain-seconds", type=float, default=180)
    p.add_argument("--eval-windows", type=int, default=128)
    p.add_argument("--ft-batch", type=int, default=32)
    p.add_argument("--ft-lr", type=float, default=1e-4)
    p.add_argument("--finetune-seconds", type=float, default=90)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared 2-core machine more threads oversubscribe)",
    )
    args = p.parse_args(argv)
    args.data = str(_data.require(__file__, args.data, *NEEDS))
    torch.set_num_threads(args.threads)
    run(args)


if __name__ == "__main__":
    main()
