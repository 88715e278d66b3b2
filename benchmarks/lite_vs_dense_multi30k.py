"""Lite Transformer against the dense Transformer at equal Mult-Adds on Multi30k En->De (CPU).

The paper's trade-off figure (Wu et al. 2020, fig. 1 / tables 1-2: BLEU against Mult-Adds,
Lite ahead of the Transformer at equal Mult-Adds), on Multi30k and a CPU budget:

- Lite models: ``lite-multi30k`` (3+3 layers, flattened FFN, LSRA with lightweight
  convolutions, kernels 3/7/15) at the widths ``--lite-dims``;
- dense models: ``transformer-multi30k`` (3+3 layers, 4 heads, FFN 4d) made narrower, each to
  the width whose Mult-Adds (:mod:`effiformer.flops`: one 30-token sentence, embeddings and
  output projection excluded, as the paper counts) are closest to one Lite model's;
- every model trained for the same ``--time-budget`` seconds with the library's trainer
  (:func:`effiformer.train.train`, the :class:`~effiformer.tasks.translation.TranslationTask`:
  one joint BPE vocabulary shared by all, token-budget batches of ``--max-tokens``) and the same
  recipe: Adam (0.9, 0.98), eps 1e-9, no weight decay, inverse-sqrt schedule with ``--warmup``
  steps to ``--lr``, no clipping, label smoothing 0.1, dropout 0.1 (the Multi30k recipe of
  ``docs/translation.md``);
- then beam search (``--beam`` 5) on ``test_2016_flickr``: sacreBLEU and chrF, and (unless
  ``--no-latency``) the decoding latency of one 30-token sentence, batch 1, beam 5
  (:func:`effiformer.bench.decoding.decoding_latency`).

Writes ``OUT/results.jsonl`` (environment, one record per model), ``OUT/bleu_vs_mult_adds.png``
and each run's checkpoint under ``OUT/NAME/``.

    python benchmarks/lite_vs_dense_multi30k.py --time-budget 1200 --out runs/lite-vs-dense
    python benchmarks/lite_vs_dense_multi30k.py --time-budget 15 --lite-dims 64 96 128 \\
        --eval-sentences 50 --test-sentences 100 --latency-runs 3 --out /tmp/lite-smoke  # smoke

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

from effiformer import create_model, get_config
from effiformer.bench import environment
from effiformer.data import ParallelData
from effiformer.flops import count_parameters, seq2seq_mult_adds
from effiformer.metrics import translation_scores
from effiformer.tasks.translation import TranslationTask
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()
LITE, DENSE = "lite-multi30k", "transformer-multi30k"


def _write(f, record: dict) -> None:
    f.write(json.dumps(record) + "\n")
    f.flush()


def dense_width_for(target: int, *, step: int = 4, lo: int = 16, hi: int = 1024) -> int:
    """The ``transformer-multi30k`` width (a multiple of ``step``, FFN 4x) whose Mult-Adds are
    closest to ``target``."""
    best = None
    for d in range(lo, hi + 1, step):
        m = seq2seq_mult_adds(get_config(DENSE, dim=d, ffn_dim=4 * d)).total
        if best is None or abs(m - target) < abs(best[1] - target):
            best = (d, m)
    return best[0]


def plan(lite_dims: list[int]) -> list[dict]:
    """The models: each Lite width and the dense width matched to its Mult-Adds."""
    runs = []
    for d in lite_dims:
        lite = seq2seq_mult_adds(get_config(LITE, dim=d, ffn_dim=d)).total
        dd = dense_width_for(lite)
        dense = seq2seq_mult_adds(get_config(DENSE, dim=dd, ffn_dim=4 * dd)).total
        runs.append(dict(kind="lite", model=LITE, dim=d, overrides={"dim": d, "ffn_dim": d},
                         mult_adds=lite))  # fmt: skip
        runs.append(dict(kind="dense", model=DENSE, dim=dd,
                         overrides={"dim": dd, "ffn_dim": 4 * dd}, mult_adds=dense))  # fmt: skip
    return runs


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, style, label in (("lite", "o-", "Lite Transformer"), ("dense", "s--", "Transformer")):
        rs = sorted((r for r in records if r["kind"] == kind), key=lambda r: r["mult_adds"])
        if rs:
            ax.plot([r["mult_adds"] / 1e6 for r in rs], [r["bleu"] for r in rs], style,
                    label=label)  # fmt: skip
            for r in rs:
                ax.annotate(f"d {r['dim']}", (r["mult_adds"] / 1e6, r["bleu"]), fontsize=7,
                            textcoords="offset points", xytext=(4, -10))  # fmt: skip
    ax.set_xlabel("Mult-Adds (M, one 30-token sentence)")
    ax.set_ylabel("test_2016_flickr sacreBLEU (beam 5)")
    budget = records[0]["time_budget"] if records else 0
    per = f"{budget / 60:.0f} CPU min" if budget >= 120 else f"{budget:.0f} CPU s"
    ax.set_title(f"Multi30k En->De, {per} of training per model")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    _data.add_data_flag(p, itself="the Multi30k folder")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--lite-dims", nargs="+", type=int, default=[128, 192, 256])
    p.add_argument("--only", choices=["lite", "dense"], help="train one kind only")
    p.add_argument("--time-budget", type=float, default=1200.0, help="training seconds per model")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--eval-sentences", type=int, default=200, help="val sentences (final eval)")
    p.add_argument("--test-split", default="test_2016_flickr")
    p.add_argument("--test-sentences", type=int, help="test sentences (default all)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--no-latency", action="store_true")
    p.add_argument("--latency-runs", type=int, default=10)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
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
    out.mkdir(parents=True, exist_ok=True)
    results = open(out / "results.jsonl", "a")
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    _write(results, {"kind": "environment", **env, "loadavg": os.getloadavg(),
                     "argv": sys.argv[1:] if argv is None else argv})  # fmt: skip
    task = TranslationTask(
        ParallelData(args.data, args.src, args.tgt),
        vocab_size=args.vocab_size,
        max_tokens=args.max_tokens,
        seed=args.seed,
        eval_sentences=args.eval_sentences,
        test_split=args.test_split,
    )
    vocab = task.tokenizer.vocab_size
    runs = [r for r in plan(args.lite_dims) if args.only in (None, r["kind"])]
    for r in runs:
        print(f"plan: {r['kind']:<5} d {r['dim']:>4}: {r['mult_adds'] / 1e6:6.1f} M Mult-Adds")
    records = []
    for r in runs:
        name = f"{r['kind']}-d{r['dim']}"
        torch.manual_seed(args.seed)
        model = create_model(r["model"], vocab_size=vocab, **r["overrides"])
        config = TrainConfig(
            steps=10**7,  # the time budget stops it; inverse-sqrt needs no total
            optimizer="adam", lr=args.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0,
            warmup=args.warmup, schedule="inverse_sqrt", clip=None, seed=args.seed,
            device="cpu", time_budget=args.time_budget, eval_every=None,
            out_dir=str(out / name), progress=False, log_every=50, model_name=r["model"],
            task="translation",
        )  # fmt: skip
        t0 = time.monotonic()
        history = train(model, task, config)
        wall = time.monotonic() - t0
        val = history.evals[-1] if history.evals else {}
        model.eval()
        task.eval_sentences = args.test_sentences
        t1 = time.monotonic()
        hyps, refs = task.hypotheses(model, args.test_split, beam=args.beam, lenpen=args.lenpen)
        decode_s = time.monotonic() - t1
        task.eval_sentences = args.eval_sentences
        scores = translation_scores(hyps, refs)
        (out / name / f"{args.test_split}.hyp.{args.tgt}").write_text("\n".join(hyps) + "\n")
        rec = {
            "kind": r["kind"], "name": name, "model": r["model"], "dim": r["dim"],
            "overrides": r["overrides"], "mult_adds": r["mult_adds"],
            "mult_adds_taps": seq2seq_mult_adds(model.config, taps=True).total,
            "params_no_embeddings": count_parameters(model), "params": model.num_params(),
            "steps": history.step, "train_s": history.seconds, "wall_s": wall,
            "stop_reason": history.stop_reason, "time_budget": args.time_budget,
            "tokens_per_s": (history.train[-1].get("tokens_per_s") if history.train else None),
            "final_loss": history.train[-1]["loss"] if history.train else None,
            "val_bleu": val.get("val_bleu"), "val_nll": val.get("val_nll"),
            "test_split": args.test_split, "sentences": len(hyps), "beam": args.beam,
            "lenpen": args.lenpen, "decode_s": decode_s, **scores,
            "recipe": {"optimizer": "adam", "lr": args.lr, "betas": [0.9, 0.98], "eps": 1e-9,
                       "schedule": "inverse_sqrt", "warmup": args.warmup,
                       "max_tokens": args.max_tokens},
        }  # fmt: skip
        if not args.no_latency:
            from effiformer.bench.decoding import decoding_latency

            lat = decoding_latency(model, src_len=30, beam=5, runs=args.latency_runs, warmup=2)
            rec["latency_ms"] = lat.total_s * 1e3
            rec["latency_encoder_ms"] = lat.encoder_s * 1e3
        records.append(rec)
        _write(results, rec)
        print(
            f"{name}: {r['mult_adds'] / 1e6:.1f} M Mult-Adds, {rec['params_no_embeddings'] / 1e6:.2f}"
            f" M params (no emb.), {history.step} steps in {history.seconds:.0f} s: test BLEU "
            f"{scores['bleu']:.2f} chrF {scores['chrf']:.1f}"
            + (f", latency {rec['latency_ms']:.1f} ms" if "latency_ms" in rec else ""),
            flush=True,
        )
    results.close()
    _plot(records, out / "bleu_vs_mult_adds.png")
    print(f"wrote {out / 'results.jsonl'} and {out / 'bleu_vs_mult_adds.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
