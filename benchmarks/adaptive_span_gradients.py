"""Where an adaptive-span LM's gradient goes under the quality suite's recipe: the long-context
table's adaptive-span model (``cpu-long``: d 256, 4 layers, max span T) trained on a corpus at
T with the suite's recipe (Adam (0.9, 0.98), lr 2e-3 after a linear warmup, one global gradient
norm clipped to 1.0), logging each step the global gradient norm and the part of it that is the
span parameters' (``current_val``, whose gradient carries the soft mask's factor S / R).

``--clip global`` is the suite's recipe before 2026-12-07 (one global norm); ``--clip split``
is the trainer's since (``effiformer.train.clip_gradients``: the span parameters, listed by the
part's ``own_clip_parameters()``, and the rest clipped to 1.0 each, so the span parameters cannot
shrink every weight's step); both from the same initial weights and the same batches.

    python benchmarks/adaptive_span_gradients.py --steps 250 --clip global split \\
        --out benchmarks/results/adaptive_span_gradients_shakespeare

Writes ``OUT/<clip>.jsonl`` (one record a step) and ``OUT/gradients.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

CORPORA = {"shakespeare": ("tinyshakespeare/input.txt", "text"), "ptb": ("ptb", "ptb-char")}


def _norm(params) -> float:
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None))


def run(args, clip: str, corpus, out: Path) -> list[dict]:
    from effiformer.bench.quality import BUDGETS, _model_overrides
    from effiformer.registry import build_model, get_config
    from effiformer.train import after_optimizer_step, clip_gradients
    from effiformer.train.optimizer import own_clip_parameters

    path = out / f"{clip}.jsonl"
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        if len(rows) >= args.steps:
            return rows
    # the model its records were measured with: the row before it lost the absolute positions
    model_name, over = _model_overrides(
        BUDGETS["cpu-long"], "lm-ptb", "adaptive-span-abspos", args.seq_len
    )
    over.update(vocab_size=corpus.vocab.size, seq_len=args.seq_len)
    torch.manual_seed(args.seed)
    model = build_model(get_config(model_name, **over))
    model.train()
    span = own_clip_parameters(model)  # the span ratios (current_val) of every layer
    span_ids = {id(p) for p in span}
    rest = [p for p in model.parameters() if id(p) not in span_ids]
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    train = torch.as_tensor(corpus.train).long()
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    with open(path, "w") as f:
        for step in range(1, args.steps + 1):
            for g in opt.param_groups:
                g["lr"] = args.lr * min(1.0, step / args.warmup)
            i = int(torch.randint(len(train) - args.seq_len - 1, (), generator=gen))
            x = train[i : i + args.seq_len][None]
            y = train[i + 1 : i + args.seq_len + 1][None]
            out_ = model(x, targets=y)
            aux = sum(v for k, v in (out_.aux or {}).items() if k.endswith("span_penalty"))
            loss = out_.loss + aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            total, s_norm, r_norm = _norm(model.parameters()), _norm(span), _norm(rest)
            if clip == "global":
                torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
            else:
                clip_gradients(model, 1.0)
            opt.step()
            after_optimizer_step(model)  # the official clamp_param: p in [0, 1]
            rec = {"step": step, "loss": float(out_.loss.detach()), "grad_norm": total,
                   "span_grad_norm": s_norm, "rest_grad_norm": r_norm,
                   "spans": [round(float(p.detach().mean()) * args.seq_len, 1) for p in span]}  # fmt: skip
            rows.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            if step % 25 == 0:
                print(f"{clip} step {step}: loss {rec['loss']:.3f} grad {total:.3g} "
                      f"(span {s_norm:.3g}, rest {r_norm:.3g})", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", choices=sorted(CORPORA), default="shakespeare")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clip", nargs="+", choices=("global", "split"), default=["global", "split"])
    p.add_argument("--out", required=True)
    _data.add_data_flag(p)
    args = p.parse_args(argv)
    rel, fmt = CORPORA[args.corpus]
    root = _data.require(__file__, args.data, rel)
    from effiformer.data import load_corpus

    corpus = load_corpus(str(root / rel), fmt)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {c: run(args, c, corpus, out) for c in args.clip}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for c, rows in runs.items():
        steps = [r["step"] for r in rows]
        a.plot(steps, [r["loss"] for r in rows], label=f"clip {c}", lw=1)
        b.semilogy(steps, [r["span_grad_norm"] for r in rows], label=f"span params ({c})", lw=1)
        b.semilogy(steps, [r["rest_grad_norm"] for r in rows], "--", label=f"the rest ({c})",
                   lw=1)  # fmt: skip
    a.set(xlabel="step", ylabel="training loss (nats)", title="adaptive span, T = 4,096")
    b.set(xlabel="step", ylabel="gradient norm before clipping", title="whose gradient")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gradients.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
