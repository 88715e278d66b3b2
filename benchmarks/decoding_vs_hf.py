"""Beam-search decoding speed: effiformer's seq2seq vs HF transformers' ``generate``, same size.

Both models are randomly initialised at the same dimensions (default ``transformer-base``: 6+6
layers, d 512, 8 heads, FFN 2048, post-LN, ReLU, sinusoidal positions, scaled and tied
embeddings; HF side: a ``MarianMTModel`` with those dims, ``activation_function="relu"``,
``scale_embedding=True``). One sentence of ``--src-len`` tokens, batch 1, beam ``--beam``, and
exactly ``--steps`` decoder steps on both sides (effiformer: EOS forbidden until the last step,
:func:`effiformer.bench.decoding.decoding_latency`; HF: ``min_new_tokens = max_new_tokens``),
each with its incremental state (KV caches). Timings alternate between the two in one process
(warm-up first; 10-90 % trimmed mean of the timed runs), under ``torch.inference_mode``.

    python benchmarks/decoding_vs_hf.py                       # base size, 30 tokens, beam 5
    python benchmarks/decoding_vs_hf.py --runs 5 --warmup 2   # quick

Needs the ``reference`` extra (transformers). Writes JSON lines to ``--out`` (default stdout).

The harness has the same comparison as rows (cells in separate processes, not alternated):
``effiformer bench transformer-base --part decoding --src-len 30 --beam 5`` (the ``hf-marian``
reference row, :func:`effiformer.bench.references.hf_marian`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from effiformer import create_model
from effiformer.bench import environment
from effiformer.bench.decoding import decoding_latency, trimmed_mean
from effiformer.bench.references import hf_marian


@torch.inference_mode()
def hf_latency(model, cfg, *, src_len, beam, steps, warmup, runs, seed=0):
    g = torch.Generator().manual_seed(seed)
    specials = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    src = torch.randint(specials, cfg.vocab_size, (1, src_len), generator=g)
    src[0, -1] = cfg.eos_id
    times = []
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        out = model.generate(
            input_ids=src,
            attention_mask=torch.ones_like(src),
            num_beams=beam,
            min_new_tokens=steps,
            max_new_tokens=steps,
            do_sample=False,
            early_stopping=True,
            use_cache=True,
        )
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return trimmed_mean(times), times, out.shape[1] - 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="transformer-base")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--steps", type=int, help="decoder steps (default: --src-len)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", help="JSON lines file (default: stdout only)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or args.src_len
    torch.manual_seed(0)
    ours = create_model(args.model, vocab_size=args.vocab_size, dropout=0.0).eval()
    cfg = ours.config
    theirs = hf_marian(cfg)
    n_ours = ours.num_params()
    n_theirs = sum(p.numel() for p in theirs.parameters())
    records = [
        {
            "kind": "environment",
            **environment(torch.device("cpu"), "float32", torch.get_num_threads(), peak=False),
            "loadavg": os.getloadavg(),
        }
    ]
    ours_t, theirs_t = [], []
    for _ in range(args.rounds):
        lat = decoding_latency(
            ours,
            src_len=args.src_len,
            beam=args.beam,
            steps=steps,
            warmup=args.warmup,
            runs=args.runs,
        )
        ours_t.append(lat.total_s)
        hf_s, _, hf_steps = hf_latency(
            theirs, cfg, src_len=args.src_len, beam=args.beam, steps=steps, warmup=args.warmup,
            runs=args.runs,
        )  # fmt: skip
        theirs_t.append(hf_s)
        records.append(
            {
                "kind": "round", "effiformer_s": lat.total_s, "effiformer_encoder_s": lat.encoder_s,
                "hf_s": hf_s, "hf_generated": hf_steps, "speedup": hf_s / lat.total_s,
            }
        )  # fmt: skip
    result = {
        "kind": "result", "model": args.model, "params_effiformer": n_ours, "params_hf": n_theirs,
        "vocab_size": args.vocab_size, "src_len": args.src_len, "steps": steps, "beam": args.beam,
        "runs": args.runs, "rounds": args.rounds, "effiformer_s": min(ours_t), "hf_s": min(theirs_t),
        "speedup": min(theirs_t) / min(ours_t),
        # under load the fastest round is the luckiest one: the medians, and the median of each
        # round's HF / ours (the two ran back to back there, under the same load), say more
        "effiformer_median_s": statistics.median(ours_t), "hf_median_s": statistics.median(theirs_t),
        "speedup_median_paired": statistics.median(h / o for h, o in zip(theirs_t, ours_t)),
        "loadavg_end": os.getloadavg(),
    }  # fmt: skip
    records.append(result)
    text = "".join(json.dumps(r) + "\n" for r in records)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text)
    print(
        f"{args.model} ({n_ours / 1e6:.1f}M params; HF Marian {n_theirs / 1e6:.1f}M), batch 1, beam "
        f"{args.beam}, {steps} steps: effiformer {min(ours_t) * 1e3:.0f} ms/sentence, HF generate "
        f"{min(theirs_t) * 1e3:.0f} ms/sentence: {result['speedup']:.2f}x (fastest rounds); medians "
        f"{result['effiformer_median_s'] * 1e3:.0f} and {result['hf_median_s'] * 1e3:.0f} ms, "
        f"median paired {result['speedup_median_paired']:.2f}x",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
