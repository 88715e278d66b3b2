"""``effiformer export RUN --out DIR``: ``torch.export`` programs (``--format pt2``) or ONNX
files (``--format onnx``) of a trained model, checked against eager
(:func:`effiformer.export.export_run`)."""

from __future__ import annotations

import argparse
import json

from .common import add_common_flags, positive_int, setup_logging

EPILOG = """examples:
  effiformer export runs/m30k --out export/m30k                  # encoder.pt2 + decoder_step.pt2
  effiformer export runs/m30k --format onnx --beam 4 --out export/m30k-onnx
  effiformer export runs/tiny --out export/tiny                  # a language model: model.pt2
An encoder-decoder exports as two programs: the encoder (source ids -> the decoder layers'
projected memory) and one incremental decoder step (tokens, memory, cache -> log-probabilities,
next cache) for --beam rows per sentence; export.json lists their inputs and outputs in order.
ONNX needs the onnx and onnxscript packages (pip install 'effiformer[export]'); with
onnxruntime installed the files are checked against the programs too."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a trained model for inference (torch.export .pt2 or ONNX)",
        description="Export the model of a run (or a saved model) as torch.export programs or "
        "ONNX files with dynamic batch and lengths, checked against eager.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run", help="a run folder, run checkpoint or saved model (effiformer.save_model)"
    )
    p.add_argument("--out", required=True, help="the folder to write (must not hold an export)")
    p.add_argument("--format", choices=["pt2", "onnx"], default="pt2")
    p.add_argument(
        "--beam", type=positive_int, default=1, help="decoder rows per sentence (encoder-decoders)"
    )
    add_common_flags(p, progress=False)


def run(args: argparse.Namespace) -> int:
    from ..export import export_run

    setup_logging()
    info = export_run(args.run, args.out, fmt=args.format, beam=args.beam)
    print(json.dumps(info))
    files = [info[k] for k in ("model", "encoder", "decoder_step") if k in info]
    print(
        f"exported {args.run} ({info['kind'].replace('_', ' ')}) to {args.out}: "
        f"{', '.join(files)}; largest difference from eager {info['max_abs_diff']:.2e}"
    )
    return 0
