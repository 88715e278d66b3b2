"""``effiformer translate RUN < in.txt > out.txt``: translate one sentence per line with a
translation run (what :func:`effiformer.tasks.translation.translate_file` does, with the run
checked before stdin is read); progress on stderr."""

from __future__ import annotations

import argparse
import sys

from ..generation import translate
from ..progress import progress_bar, progress_enabled
from ..tasks.base import resolve_device
from ..tasks.translation import check_pair, load_translation_run
from .common import add_common_flags, device_name, positive_int

EPILOG = """examples:
  effiformer translate runs/m30k < sentences.en > sentences.de
  echo 'A dog runs in the snow.' | effiformer translate runs/m30k --beam 1
  effiformer translate runs/m30k --src en --tgt de --beam 5 --lenpen 1.0 < in.txt > out.txt
One sentence per line (an empty line gives an empty line); sentences longer than the model's
limit are truncated with a warning. The output is written when every line is translated."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate stdin to stdout with a translation run",
        description="Translate one sentence per line from stdin to stdout (beam search).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="run directory (its latest checkpoint) or checkpoint directory")
    p.add_argument("--beam", type=positive_int, default=5, help="beam size; 1 = greedy (default 5)")
    p.add_argument(
        "--lenpen", type=float, default=1.0, help="length penalty: score / len**lenpen (default 1)"
    )
    p.add_argument(
        "--batch", type=positive_int, default=64, help="sentences per batch (default 64)"
    )
    p.add_argument("--src", help="source language the caller expects (checked against the run)")
    p.add_argument("--tgt", help="target language the caller expects (checked against the run)")
    p.add_argument(
        "--device", type=device_name, default="auto", help="auto | cpu | cuda (default auto)"
    )
    add_common_flags(p)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    # the run first: a wrong run or direction is named before stdin is read
    model, tokenizer, meta = load_translation_run(args.run, device=device)
    pair = meta.get("pair")
    if pair is not None and (args.src is not None or args.tgt is not None):
        check_pair(
            pair, args.src or pair["src"], args.tgt or pair["tgt"], meta["path"], direction=True
        )
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"stdin is not UTF-8 text (byte {e.start}: {e.reason})") from None
    lines = [line.strip() for line in text.splitlines()]
    with progress_enabled(not args.no_progress):
        bar = progress_bar(len(lines), desc="translate", unit="sent", delay=1.0)
        try:
            out = translate(
                model,
                lines,
                tokenizer=tokenizer,
                beam=args.beam,
                lenpen=args.lenpen,
                batch_size=args.batch,
                progress=lambda done: bar.update(done - bar.n),
            )
        finally:
            bar.close()
    sys.stdout.buffer.write("".join(line + "\n" for line in out).encode("utf-8"))
    sys.stdout.flush()
    return 0
