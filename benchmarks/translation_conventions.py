"""One trained translation run scored under this project's and the papers' evaluation conventions.

Vaswani et al. 2017 (sec. 6.1), Lite Transformer and HAT report WMT En-De from the average of the
last checkpoints, decoded with beam 4 and length penalty 0.6, scored with tokenized BLEU on
compound-split text; this project's default is the last checkpoint, beam 5, length penalty 1.0
(fairseq's form), sacreBLEU. This script scores the same run every way, so that the two can be
compared and each step's share seen:

- checkpoints: the last one, and the averages of the last 5 and 10 (:func:`effiformer.average.
  average_run`, what ``effiformer average RUN --last N`` writes; the run must have kept them:
  ``--checkpoint-every N --keep 10``);
- decoding: beam 5 / length penalty 1.0 (fairseq form, ``score / len``), beam 4 / 0.6 in the
  GNMT form ``((5 + len) / 6) ** 0.6`` (tensor2tensor's ``alpha``, Vaswani et al.) and beam 4 /
  0.6 in fairseq's form (what Lite Transformer's and HAT's fairseq ``--lenpen 0.6`` computes);
- scores: sacreBLEU (detokenized, ``13a``; the headline) and the tokenized compound-split BLEU
  (the WMT papers' convention), chrF.

Every evaluation goes through :func:`effiformer.tasks.translation.evaluate_run` (what
``effiformer eval`` calls). Writes ``OUT/results.jsonl`` (one record per (checkpoints, decoding)),
``OUT/table.md`` and ``OUT/avg{N}/`` (the averaged runs, with their hypotheses).

    python benchmarks/translation_conventions.py --run runs/m30k-ckpt/run \\
        --out benchmarks/results/translation_multi30k_conventions
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from effiformer.average import average_run, run_checkpoints
from effiformer.bench import environment
from effiformer.checkpoint import LATEST
from effiformer.tasks.translation import evaluate_run

#: (name, beam, lenpen, lenpen form)
DECODINGS = (
    ("beam5-lp1.0", 5, 1.0, "fairseq"),
    ("beam4-lp0.6-gnmt", 4, 0.6, "gnmt"),
    ("beam4-lp0.6-fairseq", 4, 0.6, "fairseq"),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", required=True, help="the training run folder (with its checkpoints)")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--average", nargs="*", type=int, default=[5, 10], help="last N to average")
    p.add_argument("--sentences", type=int, help="only the first N pairs (default all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    run, out = Path(args.run), Path(args.out)
    kept = run_checkpoints(run)
    if not kept:
        print(f"error: {run} holds no checkpoints", file=sys.stderr)
        return 2
    too_many = [n for n in args.average if n > len(kept)]
    if too_many:
        print(
            f"error: {run} keeps {len(kept)} checkpoints, fewer than --average {too_many}",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    sources = {"last": run}
    for n in args.average:
        target = out / f"avg{n}"
        if not (target / LATEST).exists():  # a rerun reuses the averages written before
            average_run(run, n, target)
        sources[f"avg{n}"] = target
    env = environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False)
    records = []
    with open(out / "results.jsonl", "w") as f:
        f.write(json.dumps({"kind": "environment", **env, "loadavg": os.getloadavg(),
                            "argv": sys.argv[1:] if argv is None else argv,
                            "checkpoints": [c.name for c in kept]}) + "\n")  # fmt: skip
        for ckpt, path in sources.items():
            for name, beam, lenpen, form in DECODINGS:
                t0 = time.monotonic()
                r = evaluate_run(
                    path, args.split, beam=beam, lenpen=lenpen, lenpen_form=form,
                    sentences=args.sentences,
                )  # fmt: skip
                rec = {
                    "kind": "score",
                    **{k: v for k, v in r.items() if isinstance(v, int | float | str)},
                    "convention": r.get("decoding"),  # what evaluate_run says it took
                    "checkpoints": ckpt, "decoding": name, "beam": beam, "lenpen": lenpen,
                    "lenpen_form": form, "split": args.split, "seconds": time.monotonic() - t0,
                }  # fmt: skip
                records.append(rec)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(
                    f"{ckpt:6s} {name:20s} sacreBLEU {r['bleu']:.2f}  tokenized compound-split "
                    f"{r.get('bleu_tok', float('nan')):.2f}  chrF {r['chrf']:.2f}",
                    flush=True,
                )
    lines = [
        f"Test split `{args.split}`, {records[0].get('sentences', '?')} sentences; run "
        f"`{run}` ({len(kept)} checkpoints kept: {kept[0].name} .. {kept[-1].name}).",
        "",
        "| checkpoints | decoding | sacreBLEU | tokenized compound-split BLEU | chrF |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['checkpoints']} | {r['decoding']} | {r['bleu']:.2f} | "
            f"{r.get('bleu_tok', float('nan')):.2f} | {r['chrf']:.2f} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
