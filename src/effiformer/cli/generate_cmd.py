"""``effiformer generate RUN --prompt TEXT``: sample text from a language-model run
(:meth:`effiformer.models.base.EffiModel.generate`), encoded and decoded with the run's own
vocabulary (``vocab.json`` beside the weights). A folder of :func:`effiformer.save_model` works
too: with a ``vocab.json`` put beside its weights, or, for a byte-level model (``vocab_size``
256, like ``vanilla-small``), with none: the prompt is its UTF-8 bytes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from ..checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_config,
    load_model,
    resolve_checkpoint,
)
from ..data import Vocab
from ..tasks.base import resolve_device
from .common import add_common_flags, device_name, saved_model_dir, saved_model_lacks

EPILOG = """examples:
  effiformer generate runs/tiny --prompt 'def main(' --max-new-tokens 100
  effiformer generate runs/shakespeare --prompt 'ROMEO:' --temperature 0.8 --top-k 40 --seed 1
  effiformer generate runs/xl --prompt 'The ' --temperature 0          # greedy
  effiformer generate ckpt --prompt 'The ' --max-new-tokens 50  # effiformer.save_model(m, 'ckpt')
The run must be a language-model run (effiformer train NAME [--task lm]); the text is the prompt
followed by what the model wrote. A saved model (effiformer.save_model: model.safetensors +
config.json) has no vocabulary of its own: a byte-level one (vocab_size 256) reads the prompt as
UTF-8 bytes; any other needs its run's vocab.json put beside model.safetensors."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="sample text from a trained language model",
        description="Sample a continuation of --prompt from a language-model run, with its "
        "vocabulary; prints the prompt and the continuation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run",
        help="run directory (its latest checkpoint), checkpoint directory, or a folder of "
        "effiformer.save_model",
    )
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
    add_common_flags(p, progress=False, threads=True)


def _prompt_ids(vocab: Vocab, prompt: str) -> torch.Tensor:
    ids = vocab.encode(prompt) if prompt else vocab.encode("\n")
    if ids.numel() == 0:  # a prompt of whitespace in a word vocab
        ids = vocab.encode("\n")
    if ids.numel() == 0:
        raise ValueError(
            f"the prompt {prompt!r} encodes to no token of the run's {vocab.unit} vocab"
        )
    return ids


#: The vocabulary size of a byte-level model, whose tokens are the 256 byte values.
BYTE_VOCAB_SIZE = 256


def _saved_model_vocab(directory: Path) -> Vocab:
    """The vocabulary of a folder of :func:`effiformer.save_model`: a ``vocab.json`` put beside
    the weights, else the byte vocabulary of a byte-level model (``vocab_size`` 256)."""
    config = load_config(directory)
    vocab_path = directory / "vocab.json"
    if vocab_path.is_file():
        vocab = Vocab.from_json(vocab_path.read_text())
    elif config.vocab_size == BYTE_VOCAB_SIZE:
        return Vocab.byte_level()
    else:
        raise saved_model_lacks(
            directory,
            f"a vocabulary (vocab.json) for its vocab_size={config.vocab_size} ids",
            "generate encodes the prompt with it: pass the language-model run folder "
            "(effiformer train NAME --out RUN), or put that run's vocab.json beside "
            "model.safetensors (a byte-level model, vocab_size 256, needs none)",
        )
    if vocab.size != config.vocab_size:
        raise CheckpointError(
            f"{str(vocab_path)!r} has {vocab.size} tokens but the model's vocab_size is "
            f"{config.vocab_size}; the files are from different runs"
        )
    return vocab


def _load_saved_model(directory: Path, device: torch.device) -> nn.Module:
    """The language model of a folder of :func:`effiformer.save_model` (refusing others)."""
    model = load_model(directory, map_location=device)
    family = model.config.family
    if callable(getattr(model, "translate", None)):
        raise ValueError(
            f"{str(directory)!r} holds an encoder-decoder ({family!r}): generate samples from "
            "language models; translate sentences with effiformer translate"
        )
    if not getattr(model.config, "causal", False):
        raise ValueError(
            f"{str(directory)!r} holds a bidirectional {family!r} model (causal=False): generate "
            "samples from causal language models"
        )
    return model


def run(args: argparse.Namespace) -> int:
    saved = saved_model_dir(args.run)
    if saved is not None:
        vocab = _saved_model_vocab(saved)
    else:
        ckpt = resolve_checkpoint(args.run)
        vocab_path = ckpt / "vocab.json"
        if not vocab_path.is_file():
            raise CheckpointError(
                f"{str(ckpt)!r} has no vocab.json: generate samples from language-model runs "
                "(effiformer train NAME [--task lm]); translation runs: effiformer translate"
            )
        vocab = Vocab.from_json(vocab_path.read_text())
    device = resolve_device(args.device)
    if saved is not None:
        model = _load_saved_model(saved, device)
    else:
        model, _ = load_checkpoint(ckpt, map_location=device)
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
