"""How long ``torch.compile`` (inductor by default) takes for a model's first training step, and
what a compiled step costs after it beside an eager one.

    python benchmarks/compile_time.py sparse-tiny --threads 1

The first call of the compiled model runs one forward and backward (batch 2 x 64 ids, loss on
the same ids) and is timed whole: tracing, code generation and the step. Then five compiled and
five eager steps. Prints one JSON line. Compile times depend on inductor's on-disk cache (a
second run of the same model is faster); a cold measure needs a fresh ``TORCHINDUCTOR_CACHE_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from effiformer import create_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model")
    p.add_argument("--backend", default="inductor")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = create_model(args.model).train()
    ids = torch.randint(0, 50, (2, 64), generator=torch.Generator().manual_seed(0))

    def step(f) -> float:
        t0 = time.perf_counter()
        f(ids, targets=ids).loss.backward()
        return time.perf_counter() - t0

    compiled = torch.compile(model, backend=args.backend)
    first = step(compiled)
    timed = [step(compiled) for _ in range(args.steps)]
    eager = [step(model) for _ in range(args.steps)]
    print(json.dumps({
        "model": args.model, "backend": args.backend, "threads": args.threads,
        "first_call_s": first, "compiled_step_s": sorted(timed)[len(timed) // 2],
        "eager_step_s": sorted(eager)[len(eager) // 2], "loadavg": os.getloadavg(),
        "torch": torch.__version__,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
