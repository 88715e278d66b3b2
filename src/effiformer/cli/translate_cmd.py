"""``effiformer translate RUN < in.txt > out.txt``: translate one sentence per line with a
translation run (what :func:`effiformer.tasks.translation.translate_file` does, with the run
checked before stdin is read); progress on stderr. A folder of :func:`effiformer.save_model`
works too once the tokenizer of its run (``tokenizer.json``) is put beside its weights; without
one it is refused in one line that says so."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import load_config, load_model
from ..data.tokenizer import TOKENIZER_FILE, SubwordTokenizer, TokenizerError
from ..generation import translate
from ..progress import progress_bar, progress_enabled
from ..recipes import LENPEN_FORMS
from ..registry import build_model
from ..tasks.base import resolve_device
from ..tasks.translation import (
    check_pair,
    check_translation_model,
    load_translation_run,
    read_pair,
    resolve_decoding,
)
from .common import (
    add_common_flags,
    device_name,
    positive_int,
    saved_model_dir,
    saved_model_lacks,
)

logger = logging.getLogger(__name__)

EPILOG = """examples:
  effiformer translate runs/m30k < sentences.en > sentences.de
  echo 'A dog runs in the snow.' | effiformer translate runs/m30k --beam 1
  effiformer translate runs/m30k --src en --tgt de --beam 5 --lenpen 1.0 < in.txt > out.txt
Without --beam/--lenpen/--lenpen-form a run decodes as the paper of its configuration did
(transformer-base: beam 4, GNMT penalty 0.6; lite-wmt-*, hat-wmt-*: beam 4, lenpen 0.6; ...),
other models with fairseq's beam 5, lenpen 1; the log line says which.
One sentence per line (an empty line gives an empty line); sentences longer than the model's
limit are truncated with a warning. The output is written when every line is translated.
A folder of effiformer.save_model (model.safetensors + config.json) holds no tokenizer: put the
tokenizer.json of its translation run beside model.safetensors (translation.json, the language
pair, too, for --src/--tgt to be checked)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate stdin to stdout with a translation run",
        description="Translate one sentence per line from stdin to stdout (beam search).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run",
        help="run directory (its latest checkpoint), checkpoint directory, or a folder of "
        "effiformer.save_model with its run's tokenizer.json",
    )
    p.add_argument(
        "--beam",
        type=positive_int,
        default=None,
        help="beam size; 1 = greedy (default: the configuration's paper convention, else 5)",
    )
    p.add_argument(
        "--lenpen",
        type=float,
        default=None,
        help="length penalty (default: the configuration's paper convention, else 1)",
    )
    p.add_argument(
        "--lenpen-form",
        choices=LENPEN_FORMS,
        default=None,
        help="fairseq: score / len**lenpen; gnmt: score / ((5 + len) / 6)**lenpen, Vaswani et "
        "al.'s (default: the configuration's paper convention, else fairseq)",
    )
    p.add_argument(
        "--batch", type=positive_int, default=64, help="sentences per batch (default 64)"
    )
    p.add_argument("--src", help="source language the caller expects (checked against the run)")
    p.add_argument("--tgt", help="target language the caller expects (checked against the run)")
    p.add_argument(
        "--device", type=device_name, default="auto", help="auto | cpu | cuda (default auto)"
    )
    add_common_flags(p, threads=True)


def _load_saved_model(
    directory: Path, device: torch.device
) -> tuple[nn.Module, SubwordTokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, meta) of a folder of :func:`effiformer.save_model` with
    a ``tokenizer.json`` (and optionally the ``translation.json`` pair) beside the weights, as
    :func:`~effiformer.tasks.translation.load_translation_run` gives them for a run."""
    config = load_config(directory)
    if config.family not in ("seq2seq", "hat") or (config.family == "hat" and config.sub is None):
        with torch.device("meta"):
            check_translation_model(build_model(config), directory)  # raises, naming why
    if not (directory / TOKENIZER_FILE).is_file():
        raise saved_model_lacks(
            directory,
            f"the tokenizer translate reads and writes sentences with ({TOKENIZER_FILE})",
            f"pass the translation run folder (effiformer train NAME --task translation --out "
            f"RUN), or put that run's {TOKENIZER_FILE} beside model.safetensors",
        )
    tokenizer = SubwordTokenizer.load(directory)
    model = load_model(directory, map_location=device)
    if model.config.vocab_size != tokenizer.vocab_size:
        raise TokenizerError(
            f"{directory}: the model has vocab_size={model.config.vocab_size} but its "
            f"{TOKENIZER_FILE} has {tokenizer.vocab_size} ids; the files are from different runs"
        )
    model.to(device).eval()
    name = json.loads((directory / "config.json").read_text()).get("name")
    return model, tokenizer, {"pair": read_pair(directory), "path": str(directory),
                              "model_name": name}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    # the run first: a wrong run or direction is named before stdin is read
    saved = saved_model_dir(args.run)
    if saved is not None:
        model, tokenizer, meta = _load_saved_model(saved, device)
    else:
        model, tokenizer, meta = load_translation_run(args.run, device=device)
    beam, lenpen, lenpen_form, where = resolve_decoding(
        meta.get("model_name"), args.beam, args.lenpen, args.lenpen_form
    )
    logger.info("decoding: beam %d, lenpen %g (%s); %s", beam, lenpen, lenpen_form, where)
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
                beam=beam,
                lenpen=lenpen,
                lenpen_form=lenpen_form,
                batch_size=args.batch,
                progress=lambda done: bar.update(done - bar.n),
            )
        finally:
            bar.close()
    sys.stdout.buffer.write("".join(line + "\n" for line in out).encode("utf-8"))
    sys.stdout.flush()
    return 0
