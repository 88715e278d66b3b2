"""Train ``transformer-multi30k`` on Multi30k En->De for a CPU time budget; BLEU against time.

The recipe (Vaswani et al. 2017 sec. 5.3-5.4, fairseq ``transformer`` defaults, adapted to a short
budget): Adam betas (0.9, 0.98), eps 1e-9, no weight decay; inverse-sqrt schedule with a linear
warmup (1000 steps here instead of the paper's 4000: an hour on 2 CPU cores is ~2-4k steps);
peak lr 1e-3 (the paper's d^-0.5 * warmup^-0.5 is 9.9e-4 for d = 256 at 4000 warmup steps);
label smoothing 0.1; dropout 0.1; batches of ``--max-tokens`` 4096 padded tokens; a joint BPE
vocabulary of 8000 trained on the training split. The training loop is written out here (the
library's trainer has a warmup + cosine schedule only, see the report); every piece it calls is
the library's (TranslationTask batches and loss, inverse_sqrt_factor, beam search, sacreBLEU).

Validation (every ``--eval-every`` seconds of training; evaluation time is not counted in the
budget but recorded as wall time): label-smoothed loss / NLL and greedy BLEU on ``val`` (the first
``--eval-sentences``). At the end: beam search (``--beam`` 5, ``--lenpen`` 1.0) on
``test_2016_flickr``: sacreBLEU BLEU and chrF on detokenized text with their signatures.

Writes ``OUT/results.jsonl`` (environment, train records, eval records, the final test record),
``OUT/bleu_curve.png``, ``OUT/test_2016_flickr.hyp.de`` and the model (``OUT/model/``:
``model.safetensors``, ``config.json``, ``tokenizer.json``, ``translation.json``).

    python benchmarks/translation_multi30k.py --time-budget 3600 --out runs/multi30k   # the figure
    python benchmarks/translation_multi30k.py --time-budget 150 --eval-every 60 \\
        --eval-sentences 200 --test-sentences 200 --out /tmp/m30k-smoke               # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from effiformer import create_model, save_model
from effiformer.bench import environment
from effiformer.config import parse_overrides
from effiformer.data import ParallelData
from effiformer.metrics import translation_scores
from effiformer.schedules import inverse_sqrt_factor
from effiformer.tasks.translation import PAIR_FILE, TranslationTask

DATA = Path(
    os.environ.get("EFFIFORMER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


def _write(f, record: dict) -> None:
    f.write(json.dumps(record) + "\n")
    f.flush()


def _plot(evals: list[dict], test: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        [e["train_s"] / 60 for e in evals],
        [e["val_bleu"] for e in evals],
        "o-",
        label="val (greedy)",
    )
    if test is not None:
        ax.plot(
            [test["train_s"] / 60],
            [test["bleu"]],
            "r*",
            ms=12,
            label=f"test_2016_flickr (beam {test['beam']})",
        )
    ax.axhline(30, color="grey", ls=":", lw=1)
    ax.set_xlabel("training time (min, evaluation excluded)")
    ax.set_ylabel("sacreBLEU")
    ax.set_title("transformer-multi30k, Multi30k En->De, CPU")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=str(DATA / "multi30k"))
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--model", default="transformer-multi30k")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--time-budget", type=float, default=3600.0, help="training seconds")
    p.add_argument("--max-steps", type=int, help="stop after this many steps as well")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--clip", type=float, default=0.0, help="gradient norm clip (0: none)")
    p.add_argument("--eval-every", type=float, default=300.0, help="training seconds")
    p.add_argument("--eval-sentences", type=int, help="val sentences for BLEU (default all)")
    p.add_argument("--test-split", default="test_2016_flickr")
    p.add_argument("--test-sentences", type=int, help="test sentences (default all)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    t_wall = time.monotonic()
    task = TranslationTask(
        ParallelData(args.data, args.src, args.tgt),
        vocab_size=args.vocab_size,
        max_tokens=args.max_tokens,
        seed=args.seed,
        eval_sentences=args.eval_sentences,
        test_split=args.test_split,
    )
    from effiformer import get_config

    overrides = parse_overrides(get_config(args.model), args.set)
    model = create_model(args.model, vocab_size=task.tokenizer.vocab_size, **overrides)
    opt = torch.optim.Adam(
        model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: inverse_sqrt_factor(s, warmup=args.warmup)
    )
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    results = open(out / "results.jsonl", "w")
    _write(
        results, {"kind": "environment", **env, "loadavg": os.getloadavg(), "argv": sys.argv[1:]}
    )
    _write(
        results,
        {
            "kind": "setup",
            "model": args.model,
            "config": model.config.to_dict(),
            "params": model.num_params(),
            "vocab_size": task.tokenizer.vocab_size,
            "train_pairs": len(task.train),
            "recipe": {
                "optimizer": "Adam", "betas": [0.9, 0.98], "eps": 1e-9, "lr": args.lr,
                "schedule": "inverse_sqrt", "warmup": args.warmup, "max_tokens": args.max_tokens,
                "label_smoothing": model.config.label_smoothing, "dropout": model.config.dropout,
                "clip": args.clip,
            },
        },
    )  # fmt: skip
    evals: list[dict] = []

    def evaluate(step: int, train_s: float) -> None:
        t0 = time.monotonic()
        r = task.evaluate(model, "valid", beam=1)
        rec = {
            "kind": "eval", "step": step, "train_s": train_s, "wall_s": time.monotonic() - t_wall,
            "eval_s": time.monotonic() - t0, "val_bleu": r["bleu"], "val_chrf": r["chrf"],
            "val_loss": r["loss"], "val_nll": r["nll"], "sentences": r["sentences"],
            "bleu_signature": r["bleu_signature"],
        }  # fmt: skip
        evals.append(rec)
        _write(results, rec)
        print(
            f"step {step} {train_s / 60:.1f} min: val BLEU {r['bleu']:.2f} chrF {r['chrf']:.1f} "
            f"nll {r['nll']:.3f} ({rec['eval_s']:.0f} s to evaluate)",
            flush=True,
        )

    batches = task.train_batches(model)
    model.train()
    step, train_s, next_eval = 0, 0.0, args.eval_every
    tokens = 0
    while train_s < args.time_budget and (args.max_steps is None or step < args.max_steps):
        t0 = time.perf_counter()
        batch = next(batches)
        loss = task.forward(model, batch, None).loss  # mean label-smoothed nats per target
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
        step += 1
        tokens += int((batch.data["targets"] != task.tokenizer.pad_id).sum())
        train_s += time.perf_counter() - t0
        if step % args.log_every == 0:
            _write(
                results,
                {
                    "kind": "train", "step": step, "train_s": train_s, "loss": loss.item(),
                    "lr": sched.get_last_lr()[0], "tgt_tokens": tokens, "steps_per_s": step / train_s,
                },
            )  # fmt: skip
            print(f"step {step}: loss {loss.item():.3f}, {step / train_s:.3f} steps/s", flush=True)
        if train_s >= next_eval:
            evaluate(step, train_s)
            model.train()
            next_eval += args.eval_every
    if not evals or evals[-1]["step"] != step:
        evaluate(step, train_s)

    # The test split, beam search.
    model.eval()
    t0 = time.monotonic()
    task.eval_sentences = args.test_sentences
    hyps, refs = task.hypotheses(model, args.test_split, beam=args.beam, lenpen=args.lenpen)
    decode_s = time.monotonic() - t0
    scores = translation_scores(hyps, refs)
    (out / f"{args.test_split}.hyp.{args.tgt}").write_text("\n".join(hyps) + "\n")
    test = {
        "kind": "test", "split": args.test_split, "step": step, "train_s": train_s,
        "wall_s": time.monotonic() - t_wall, "beam": args.beam, "lenpen": args.lenpen,
        "sentences": len(hyps), "decode_s": decode_s, "steps_per_s": step / max(train_s, 1e-9),
        "tgt_tokens_seen": tokens, "epochs": tokens / sum(len(t) + 1 for t in task.encoded("train")[1]),
        **scores,
    }  # fmt: skip
    _write(results, test)
    results.close()
    save_model(model, out / "model", name=args.model)
    task.tokenizer.save(out / "model")
    (out / "model" / PAIR_FILE).write_text(json.dumps({"src": args.src, "tgt": args.tgt}) + "\n")
    _plot(evals, test, out / "bleu_curve.png")
    print(
        f"{args.test_split}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} (beam {args.beam}, "
        f"{len(hyps)} sentences, {decode_s:.0f} s) after {step} steps / {train_s / 60:.1f} min; "
        f"{scores['bleu_signature']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
