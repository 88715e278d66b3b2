"""Where beam-search decoding spends its time, ours against HF Marian, operator by operator
(torch profiler, self CPU time per operator summed over ``--rounds`` alternated sentences each):
which operators grow when the machine is loaded (issue 28, item 9).

    python benchmarks/decoding_ops_profile.py --threads 2 --rounds 4

Same model and shape as ``benchmarks/decoding_vs_hf.py`` (``transformer-base`` at random
weights, one 30-token sentence, beam 5, 30 decoder steps); prints the wall time per sentence of
each and the 25 operators with the most time. Needs the ``reference`` extra (transformers).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import torch

from effiformer import create_model
from effiformer.bench.references import hf_marian
from effiformer.generation import beam_search


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours = create_model("transformer-base", vocab_size=32000, dropout=0.0).eval()
    cfg = ours.config
    hf = hf_marian(cfg)
    src = torch.randint(4, 32000, (1, 30), generator=torch.Generator().manual_seed(0))
    src[0, -1] = cfg.eos_id

    def run_ours():
        beam_search(ours, src, beam=5, max_len_a=0, max_len_b=29, min_len=29, early_stopping=True)

    def run_hf():
        hf.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=5,
                    min_new_tokens=30, max_new_tokens=30, do_sample=False, early_stopping=True,
                    use_cache=True)  # fmt: skip

    totals = {"ours": collections.Counter(), "hf": collections.Counter()}
    wall = {"ours": 0.0, "hf": 0.0}
    with torch.inference_mode():
        run_ours()
        run_hf()
        for _ in range(args.rounds):
            for name, fn in (("ours", run_ours), ("hf", run_hf)):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as pr:
                    t0 = time.perf_counter()
                    fn()
                    wall[name] += time.perf_counter() - t0
                for e in pr.key_averages():
                    totals[name][e.key] += e.self_cpu_time_total
    n = args.rounds
    print(f"threads {args.threads}, {n} rounds: wall per sentence ours {wall['ours'] / n:.3f} s, "
          f"HF {wall['hf'] / n:.3f} s")  # fmt: skip
    keys = sorted(set(totals["ours"]) | set(totals["hf"]),
                  key=lambda k: -(totals["ours"][k] + totals["hf"][k]))[: args.top]  # fmt: skip
    for k in keys:
        print(
            f"{k:50s} ours {totals['ours'][k] / n / 1e3:9.1f} ms   HF {totals['hf'][k] / n / 1e3:9.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
