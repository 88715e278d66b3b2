"""``effiformer generate RUN --prompt TEXT``: sample text from a language-model run
(:meth:`effiformer.models.base.EffiModel.generate`), encoded and decoded with the run's own
vocabulary (``vocab.json`` beside the weights)."""

from __future__ import annotations

import argparse
import sys

import torch

from ..checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from ..data import Vocab
from ..tasks.base import resolve_device
from .common import add_common_flags, device_name

EPILOG = """examples:
  effiformer generate runs/tiny --prompt 'def main(' --max-new-tokens 100
  effiformer generate runs/shakespeare --prompt 'ROMEO:' --temperature 0.8 --top-k 40 --seed 1
  effiformer generate runs/xl --prompt 'The ' --temperature 0          # greedy
The run must be a language-model run (effiformer train NAME [--task lm]); the text is the prompt
followed by what the model wrote."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="sample text from a trained language model",
        description="Sample a continuation of --prompt from a language-model run, with its "
        "vocabulary; prints the prompt and the continuation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="run directory (its latest checkpoint) or checkpoint directory")
    p.add_argument(
        "--prompt", default="", help="text to continue (default: start from a line break)"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=200, help="tokens to generate (default 200)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature; 0 = greedy (default 1)",
    )
    p.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, help="sample among the smallest set with mass p")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--device", type=device_name, default="auto", help="auto | cpu | cuda (default auto)"
    )
    add_common_flags(p, progress=False)


def _prompt_ids(vocab: Vocab, prompt: str) -> torch.Tensor:
    ids = vocab.encode(prompt) if prompt else vocab.encode("\n")
    if ids.numel() == 0:  # a prompt of whitespace in a word vocab
        ids = vocab.encode("\n")
    if ids.numel() == 0:
        raise ValueError(
            f"the prompt {prompt!r} encodes to no token of the run's {vocab.unit} vocab"
        )
    return ids


def run(args: argparse.Namespace) -> int:
    ckpt = resolve_checkpoint(args.run)
    vocab_path = ckpt / "vocab.json"
    if not vocab_path.is_file():
        raise CheckpointError(
            f"{str(ckpt)!r} has no vocab.json: generate samples from language-model runs "
            "(effiformer train NAME [--task lm]); translation runs: effiformer translate"
        )
    vocab = Vocab.from_json(vocab_path.read_text())
    device = resolve_device(args.device)
    model, meta = load_checkpoint(ckpt, map_location=device)
    model.to(device).eval()
    ids = _prompt_ids(vocab, args.prompt)[None, :].to(device)  # (1, T)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    out = model.generate(
        ids,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=generator,
    )  # (1, T + new)
    text = vocab.decode(out[0].cpu()) if args.prompt else vocab.decode(out[0, ids.shape[1] :].cpu())
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0
