"""Lite Transformer's LSRA layer against dense self-attention, and its decoding latency.

1. ``layer``: one self-attention layer, forward + backward (``effiformer bench --part attention``'s
   workload: the model's first attention layer on x (B, T, D) requiring grad, backward of ``.sum()``),
   timed interleaved in one process (every workload once per round, median of the rounds), at
   d 512, batch 1, 1,024 tokens by default:

   - ``dense``: ``transformer-base``'s first encoder self-attention (8 heads of 64, SDPA);
   - ``lsra-lightweight``: ``lite-iwslt-160`` widened to d 512 (4-head attention on 256 channels
     + lightweight convolution on 256, no GLU), kernel 31;
   - ``lsra-dynamic``: ``lite-wmt-496`` widened to d 512 (dynamic convolution + GLU), kernel 31;
   - the same two LSRA layers with the convolution forced to each form (``band``, ``unfold``,
     ``conv1d``), to show what the form costs.

   DropConnect and dropout are off (``weight_dropout=0``, ``attn_dropout=0``), as the bench
   harness sets every model dropout to 0. Each record carries the layer's Mult-Adds
   (``AttentionPart.mult_adds``) and its time relative to ``dense``.
2. ``decoding``: :func:`effiformer.bench.decoding.decoding_latency` (HAT's measurement: batch 1,
   beam 5, a 30-token source, exactly 30 decoder steps, 10-90 % trimmed mean) of
   ``lite-multi30k`` beside ``transformer-multi30k`` (8k vocabulary), alternating models per
   round, with their Mult-Adds (:mod:`effiformer.flops`).

Writes one JSON line per record (with the environment) to ``--out`` and prints a summary.

    PYTHONPATH=src python benchmarks/lite_bench.py --repeats 10 --rounds 3 \\
        --out benchmarks/results/lite_bench.jsonl                      # the figures
    PYTHONPATH=src python benchmarks/lite_bench.py --repeats 3 --rounds 1 --runs 3   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from effiformer import create_model, get_config
from effiformer.bench.cell import model_workload
from effiformer.bench.decoding import decoding_latency
from effiformer.bench.references import CellSpec
from effiformer.flops import attention_mult_adds, seq2seq_mult_adds


def _git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _env() -> dict:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "git_sha": _git_sha(),
        "device": "cpu",
        "loadavg": os.getloadavg(),
    }


LAYERS = {
    # key: (registered name, overrides besides width/heads/kernel)
    "dense": ("transformer-base", {}),
    "lsra-lightweight": ("lite-iwslt-160", {}),
    "lsra-dynamic": ("lite-wmt-496", {}),
}


def _layer_workloads(t: int, batch: int, dim: int, heads: int, kernel: int, forms: bool):
    out = {}
    for key, (name, extra) in LAYERS.items():
        variants = [(key, None)]
        if forms and key != "dense":
            methods = ("band", "unfold") + (("conv1d",) if key == "lsra-lightweight" else ())
            variants += [(f"{key}-{m}", m) for m in methods]
        for label, method in variants:
            over = {"dim": dim, "n_heads": heads, "seq_len": t, "dropout": 0.0, "attn_dropout": 0.0}
            over["ffn_dim"] = get_config(name).ffn_dim  # the FFN is not timed
            if key != "dense":
                att = {"kernel_sizes": (kernel,), "weight_dropout": 0.0}
                if method is not None:
                    att["method"] = method
                over["attention"] = att
            over.update(extra)
            torch.manual_seed(0)
            model = create_model(name, **over)
            spec = CellSpec(
                name=name, config=model.config, part="attention", seq_len=t, batch=batch,
                device=torch.device("cpu"), dtype=torch.float32,
            )  # fmt: skip
            c = model.config
            dims = model.encoder[0].attn.dims
            macs = attention_mult_adds(c.attention, dims, t, t)
            out[label] = (model_workload(model, spec), macs, name)
    return out


def _step(wl) -> None:
    wl.zero_grad()
    wl.step_loss(wl.forward()).backward()


def run_layers(args, env, sink) -> None:
    for t in args.lengths:
        wls = _layer_workloads(t, args.batch, args.dim, args.heads, args.kernel, not args.no_forms)
        for wl, _, _ in wls.values():  # warm-up
            _step(wl)
            _step(wl)
        times: dict[str, list[float]] = {k: [] for k in wls}
        fwd: dict[str, list[float]] = {k: [] for k in wls}
        for _ in range(args.repeats):
            for key, (wl, _, _) in wls.items():
                wl.zero_grad()
                t0 = time.perf_counter()
                wl.step_loss(wl.forward()).backward()
                times[key].append((time.perf_counter() - t0) * 1e3)
                with torch.no_grad():
                    t0 = time.perf_counter()
                    wl.forward()
                    fwd[key].append((time.perf_counter() - t0) * 1e3)
        dense = statistics.median(times["dense"])
        dense_fwd = statistics.median(fwd["dense"])
        for key, (_, macs, name) in wls.items():
            ms = statistics.median(times[key])
            rec = {
                "kind": "layer", "workload": key, "model": name, "seq_len": t,
                "batch": args.batch, "dim": args.dim, "kernel": args.kernel,
                "fwd_bwd_ms": ms, "fwd_ms": statistics.median(fwd[key]),
                "fwd_bwd_vs_dense": ms / dense,
                "fwd_vs_dense": statistics.median(fwd[key]) / dense_fwd,
                "mult_adds": macs, "samples_ms": times[key], **env,
            }  # fmt: skip
            sink(rec)
            print(
                f"T={t} {key:<26} fwd+bwd {ms:8.2f} ms ({ms / dense:5.2f}x dense)  "
                f"fwd {rec['fwd_ms']:7.2f} ms ({rec['fwd_vs_dense']:5.2f}x)  "
                f"{macs / 1e6:7.1f} M Mult-Adds",
                flush=True,
            )


def run_decoding(args, env, sink) -> None:
    names = args.decode_models
    models = {}
    for name in names:
        torch.manual_seed(0)
        models[name] = create_model(name, vocab_size=args.vocab_size)
    results: dict[str, list] = {n: [] for n in names}
    for _ in range(args.rounds):
        for name, model in models.items():
            results[name].append(
                decoding_latency(
                    model, src_len=args.src_len, beam=args.beam, runs=args.runs, warmup=args.warmup
                )  # fmt: skip
            )
    for name in names:
        rs = results[name]
        total = statistics.median(r.total_s for r in rs)
        madds = seq2seq_mult_adds(models[name].config)
        rec = {
            "kind": "decoding", "model": name, "vocab_size": args.vocab_size,
            "src_len": args.src_len, "beam": args.beam, "runs": args.runs, "rounds": args.rounds,
            "total_ms": total * 1e3,
            "encoder_ms": statistics.median(r.encoder_s for r in rs) * 1e3,
            "decoder_ms": statistics.median(r.decoder_s for r in rs) * 1e3,
            "mult_adds": madds.total if madds else None,
            "params": models[name].num_params(), "rounds_total_ms": [r.total_s * 1e3 for r in rs],
            **env,
        }  # fmt: skip
        sink(rec)
        print(
            f"decoding {name:<22} {rec['total_ms']:8.1f} ms/sentence (encoder "
            f"{rec['encoder_ms']:.1f}, decoder {rec['decoder_ms']:.1f}); "
            f"{(rec['mult_adds'] or 0) / 1e6:.0f} M Mult-Adds",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["layer", "decoding", "both"], default="both")
    p.add_argument("--lengths", nargs="+", type=int, default=[1024])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8, help="dense heads (LSRA keeps its 4)")
    p.add_argument("--kernel", type=int, default=31)
    p.add_argument("--repeats", type=int, default=10, help="interleaved layer rounds")
    p.add_argument("--no-forms", action="store_true", help="skip the forced-form LSRA rows")
    p.add_argument("--decode-models", nargs="+", default=["lite-multi30k", "transformer-multi30k"])
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--runs", type=int, default=10, help="timed sentences per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="alternating decoding rounds")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="JSON lines file (default: print only)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    env = _env()
    f = open(args.out, "a") if args.out else None

    def sink(rec: dict) -> None:
        if f is not None:
            f.write(json.dumps(rec) + "\n")
            f.flush()

    try:
        if args.part in ("layer", "both"):
            run_layers(args, env, sink)
        if args.part in ("decoding", "both"):
            run_decoding(args, env, sink)
    finally:
        if f is not None:
            f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
