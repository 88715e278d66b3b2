"""Train ``transformer-multi30k`` on Multi30k En->De for a CPU time budget; BLEU against time.

The pipeline is the library's, as ``effiformer train transformer-multi30k --task translation``
runs it: :class:`~effiformer.tasks.translation.TranslationTask` (joint BPE of ``--vocab-size``
on the training split, ``--max-tokens`` 4096 padded tokens a batch, label-smoothed loss),
:func:`effiformer.train.train` with the ``seq2seq`` recipe (Vaswani et al. 2017 sec. 5.3,
fairseq ``inverse_sqrt``: Adam betas (0.9, 0.98), eps 1e-9, no weight decay, no clipping, a
linear warmup then lr proportional to ``1/sqrt(step)``), and for the test split
:func:`~effiformer.tasks.translation.evaluate_run` (what ``effiformer eval`` calls): beam search
(``--beam`` 5, ``--lenpen`` 1.0), sacreBLEU BLEU and chrF on detokenized text with their
signatures.

Peak lr and warmup. The recipe's values are the paper's for d 512 and 100k steps: lr 7e-4
(d^-0.5 * 4000^-0.5) after 4000 warmup steps, a warmup the trainer caps at 10% of a short run.
An hour on 2 CPU cores is about 2k steps of this 7.6M-parameter model, and under inverse-sqrt
the lr after a warmup ``w`` is ``peak * sqrt(w / step)``: with the capped warmup of 200 steps it
falls to 0.32x the peak (2.2e-4) by step 2,000, so most of the short run trains at a third of an
already lower peak, while 4000 uncapped steps would never leave warmup. The defaults here are the
translation helper's recommendation for this run, peak 1e-3 after 1,000 warmup steps
(``--lr 1e-3 --warmup 1000``, lr still 0.71x the peak at step 2,000); the paper's rule for d 256
at 4000 steps gives 9.9e-4, the same peak. Not tuned here (provisional): ``--lr 7e-4 --warmup 200``
runs the recipe's values.

Validation every ``--eval-every`` steps and at the end (evaluation time is not counted in the
budget, ``time_budget_counts_eval=False``): label-smoothed loss / NLL and greedy BLEU on ``val``
(its first ``--eval-sentences``). The training time of each record is the sum of the step times
before it (evaluation excluded).

Writes ``OUT/results.jsonl`` (environment, setup, train records, eval records, the final test
record), ``OUT/bleu_curve.png``, ``OUT/test_2016_flickr.hyp.de``, the run (``OUT/run/``:
``metrics.jsonl`` and the checkpoint, which ``effiformer eval`` / ``effiformer translate`` take)
and the model (``OUT/model/``: ``model.safetensors``, ``config.json``, ``tokenizer.json``,
``translation.json``).

    python benchmarks/translation_multi30k.py --time-budget 3600 --out runs/multi30k   # the figure
    python benchmarks/translation_multi30k.py --time-budget 1e9 --max-steps 2770 --threads 1 \\
        --checkpoint-every 50 --keep 10 --out runs/m30k-ckpt      # the same steps, for averaging
    python benchmarks/translation_multi30k.py --time-budget 150 --eval-every 20 \\
        --eval-sentences 200 --test-sentences 200 --out /tmp/m30k-smoke               # smoke

The parallel text is read from ``multi30k/`` under the data folder: ``--data DIR``, else
``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout (``--data`` may also name the
Multi30k folder itself, as before); without it the script stops at once with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from effiformer import create_model, get_config, save_model
from effiformer.bench import environment
from effiformer.checkpoint import LATEST, resolve_checkpoint
from effiformer.config import parse_overrides
from effiformer.data import ParallelData
from effiformer.data.tokenizer import SubwordTokenizer
from effiformer.recipes import apply_recipe, get_recipe
from effiformer.tasks.translation import (
    PAIR_FILE,
    TranslationOptions,
    TranslationTask,
    evaluate_run,
)
from effiformer.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _data  # noqa: E402  (benchmarks/_data.py: where the data sets are)

# ../shared/data beside the checkout; EFFIFORMER_DATA or --data DIR overrides.
DATA = _data.data_root()


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
            label=f"{test['split']} (beam {test['beam']})",
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
    _data.add_data_flag(p, itself="the Multi30k folder")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--model", default="transformer-multi30k")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--time-budget", type=float, default=3600.0, help="training seconds")
    p.add_argument("--max-steps", type=int, help="stop after this many steps as well")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--lr", type=float, default=1e-3, help="peak lr (recipe: 7e-4; see above)")
    p.add_argument("--warmup", type=int, default=1000, help="warmup steps (see above)")
    p.add_argument("--clip", type=float, default=0.0, help="gradient norm clip (0: none)")
    p.add_argument("--eval-every", type=int, default=250, help="steps (0: at the end only)")
    p.add_argument("--eval-sentences", type=int, help="val sentences for BLEU (default all)")
    p.add_argument("--test-split", default="test_2016_flickr")
    p.add_argument("--test-sentences", type=int, help="test sentences (default all)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=25, help="train records every N steps")
    p.add_argument("--progress", action="store_true", help="progress bars on stderr")
    p.add_argument(
        "--checkpoint-every", type=int, help="run checkpoints every N steps (default: the end)"
    )
    p.add_argument(
        "--keep", type=int, default=1, help="newest checkpoints kept (for `effiformer average`)"
    )
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
    options = TranslationOptions(
        data=args.data,
        src=args.src,
        tgt=args.tgt,
        max_tokens=args.max_tokens,
        vocab_size=args.vocab_size,
        test_split=args.test_split,
        eval_sentences=args.eval_sentences,
    )
    # A run folder with a checkpoint is resumed (rerun the same command after a kill), with the
    # vocabulary saved in it; the records of the interrupted attempt stay in results.jsonl.
    resume = (out / "run" / LATEST).is_file()
    ckpt = resolve_checkpoint(out / "run") if resume else None
    task = TranslationTask(
        ParallelData(args.data, args.src, args.tgt),
        tokenizer=SubwordTokenizer.load(ckpt) if ckpt else None,
        tokenizer_source=str(ckpt) if ckpt else None,
        vocab_size=args.vocab_size,
        max_tokens=args.max_tokens,
        seed=args.seed,
        eval_sentences=args.eval_sentences,
        test_split=args.test_split,
        data_spec={"path": str(Path(args.data).resolve())},
    )
    overrides = parse_overrides(get_config(args.model), args.set)
    torch.manual_seed(args.seed)
    model = create_model(args.model, vocab_size=task.tokenizer.vocab_size, **overrides)
    recipe = get_recipe("seq2seq")
    choice = apply_recipe(
        recipe,
        steps=args.max_steps,
        overrides={"lr": args.lr, "warmup": args.warmup, "clip": args.clip or None},
    )
    config = TrainConfig(
        steps=args.max_steps,
        **choice.values,
        time_budget=args.time_budget,
        time_budget_counts_eval=False,
        planned_warmup_cap=None,  # the warmup is given: keep it
        eval_every=args.eval_every or None,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep,
        resume=str(out / "run") if resume else None,
        seed=args.seed,
        device="cpu",
        out_dir=str(out / "run"),
        progress=args.progress,
        model_name=args.model,
        task="translation",
        task_options=dataclasses.asdict(options),
    )
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    results = open(out / "results.jsonl", "a" if resume else "w")
    _write(
        results,
        {
            "kind": "environment",
            **env,
            "loadavg": os.getloadavg(),
            "argv": sys.argv[1:],
            "resumed": resume,
        },
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
                "name": recipe.name, "source": recipe.source, **choice.values,
                "overridden": list(choice.overridden), "max_tokens": args.max_tokens,
                "label_smoothing": model.config.label_smoothing, "dropout": model.config.dropout,
            },
        },
    )  # fmt: skip
    print(choice.describe(), flush=True)

    history = train(model, task, config)

    # Train time at each step: the sum of the step times before it (evaluation excluded).
    train_s: dict[int, float] = {history.start_step: 0.0}
    tokens: dict[int, int] = {history.start_step: 0}
    total_s, total_tokens = 0.0, 0
    for r in history.train:
        total_s += r["step_s"]
        total_tokens += int(r.get("loss_weight", 0))
        train_s[r["step"]], tokens[r["step"]] = total_s, total_tokens
        if r["step"] % args.log_every == 0:
            _write(
                results,
                {
                    "kind": "train", "step": r["step"], "train_s": total_s, "loss": r["loss"],
                    "lr": r["lr"], "tgt_tokens": total_tokens,
                    "steps_per_s": r["step"] / max(total_s, 1e-9),
                },
            )  # fmt: skip
    evals = []
    for e in history.evals:
        rec = {
            "kind": "eval", "step": e["step"], "train_s": train_s[e["step"]],
            "val_bleu": e["val_bleu"], "val_chrf": e["val_chrf"], "val_loss": e["val_loss"],
            "val_nll": e["val_nll"], "sentences": e["val_sentences"],
            "bleu_signature": e["val_bleu_signature"],
        }  # fmt: skip
        evals.append(rec)
        _write(results, rec)
        print(
            f"step {e['step']} {rec['train_s'] / 60:.1f} min: val BLEU {e['val_bleu']:.2f} "
            f"chrF {e['val_chrf']:.1f} nll {e['val_nll']:.3f}",
            flush=True,
        )

    # The test split, beam search, through what `effiformer eval RUN --split ...` calls.
    step = history.step
    t0 = time.monotonic()
    scores = evaluate_run(
        out / "run",
        args.test_split,
        beam=args.beam,
        lenpen=args.lenpen,
        out=out / f"{args.test_split}.hyp.{args.tgt}",
        sentences=args.test_sentences,
    )
    decode_s = time.monotonic() - t0
    epoch_tokens = sum(len(t) + 1 for t in task.encoded("train")[1])
    test = {
        "kind": "test", "split": args.test_split, "step": step, "train_s": total_s,
        "stop_reason": history.stop_reason, "beam": args.beam, "lenpen": args.lenpen,
        "sentences": scores["sentences"], "decode_s": decode_s,
        "steps_per_s": (step - history.start_step) / max(total_s, 1e-9),
        "tgt_tokens_seen": total_tokens, "epochs": total_tokens / epoch_tokens,
        **{k: scores[k] for k in ("bleu", "chrf", "bleu_signature", "chrf_signature", "loss",
                                  "nll")},
    }  # fmt: skip
    _write(results, test)
    results.close()
    save_model(model, out / "model", name=args.model)
    task.tokenizer.save(out / "model")
    (out / "model" / PAIR_FILE).write_text(json.dumps({"src": args.src, "tgt": args.tgt}) + "\n")
    _plot(evals, test, out / "bleu_curve.png")
    print(
        f"{args.test_split}: BLEU {scores['bleu']:.2f} chrF {scores['chrf']:.2f} (beam "
        f"{args.beam}, {scores['sentences']} sentences, {decode_s:.0f} s) after {step} steps / "
        f"{total_s / 60:.1f} min; {scores['bleu_signature']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
