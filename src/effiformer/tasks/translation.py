"""Translation: an encoder-decoder model trained on a parallel corpus, scored by sacreBLEU.

:class:`TranslationTask` implements the task protocol of :mod:`effiformer.tasks`:

- data: a :class:`~effiformer.data.parallel.ParallelData` folder read ``src`` -> ``tgt``; a
  joint BPE vocabulary trained on its training split (or a given one), saved beside every
  checkpoint as ``tokenizer.json`` with ``translation.json`` (the language pair);
- training batches: :class:`~effiformer.data.parallel.TokenBatcher` (``max_tokens`` padded tokens
  a batch, length-bucketed, resumable); each batch holds ``input_ids`` (B, S) (source + EOS,
  right-padded), ``tgt_in`` (B, T) (BOS + target) and ``targets`` (B, T) (target + EOS);
  under DDP each rank takes a contiguous, near-equal share of the rows;
- evaluation: teacher-forced label-smoothed loss and NLL (nats per target token) and, by
  decoding the split (greedy or beam search), corpus BLEU and chrF from sacreBLEU on detokenized
  text, with their signatures.

Library functions the CLI calls: :func:`load_translation_run` (model, tokenizer and language
pair of a run directory), :func:`evaluate_run` (``effiformer eval RUN --split NAME``: BLEU/chrF
and the hypotheses written to a file) and :func:`translate_file` (``effiformer translate RUN``).

Bad input: a sentence longer than the model's ``seq_len`` is refused at training (the file, the
line and the length are named) and truncated with a warning at translation time; a vocabulary
or checkpoint of another language pair, a run without ``tokenizer.json`` and a checkpoint whose
vocabulary size differs from its tokenizer's are refused before anything is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..data.parallel import ParallelData, TokenBatcher, train_joint_tokenizer
from ..data.tokenizer import TOKENIZER_FILE, SubwordTokenizer, TokenizerError
from ..models.base import ModelOutput
from ..progress import progress_bar, status, track
from .base import Batch, restore_position
from .registry import BuildContext, EvalReport, TaskSetup, register_task, task_option

__all__ = [
    "PAIR_FILE",
    "TranslationEvalOptions",
    "TranslationOptions",
    "TranslationTask",
    "build_translation",
    "evaluate_translation",
    "check_pair",
    "evaluate_run",
    "load_translation_run",
    "read_pair",
    "resolve_decoding",
    "translate_file",
]

logger = logging.getLogger(__name__)

PAIR_FILE = "translation.json"
_SPLIT_ALIASES = {"valid": "valid_split", "test": "test_split"}


def read_pair(directory: str | os.PathLike) -> dict[str, str] | None:
    """The ``{"src", "tgt"}`` language pair saved beside a tokenizer/checkpoint, or None."""
    p = Path(directory)
    p = p / PAIR_FILE if p.is_dir() else p.with_name(PAIR_FILE)
    if not p.is_file():
        return None
    try:
        pair = json.loads(p.read_text())
        return {"src": str(pair["src"]), "tgt": str(pair["tgt"])}
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise TokenizerError(f"{p}: not a valid {PAIR_FILE} ({e})") from None


def check_pair(
    saved: dict[str, str] | None, src: str, tgt: str, where: str, *, direction: bool
) -> None:
    """Refuse a vocabulary (``direction=False``: the same two languages) or a model
    (``direction=True``: the same source and target) made for another language pair."""
    if saved is None:
        return
    if direction and (saved["src"], saved["tgt"]) != (src, tgt):
        raise ValueError(
            f"{where} translates {saved['src']}->{saved['tgt']}, not {src}->{tgt}; train a model "
            "for this direction"
        )
    if not direction and {saved["src"], saved["tgt"]} != {src, tgt}:
        raise ValueError(
            f"the vocabulary at {where} was trained on {saved['src']}-{saved['tgt']}, not "
            f"{src}-{tgt}; its subwords would not cover this language pair"
        )


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class TranslationTask:
    """Translation ``data.src_lang`` -> ``data.tgt_lang``.

    ``tokenizer``: a joint vocabulary (None: train one of ``vocab_size`` on ``train_split``);
    ``tokenizer_source``: where a given tokenizer came from (its ``translation.json`` must name
    the same two languages); ``max_tokens``: padded tokens per training batch (fairseq
    ``--max-tokens``); ``valid_split`` / ``test_split``: what the trainer's ``"valid"`` / ``"test"``
    mean (any other name is a split of ``data``); ``eval_beam`` / ``eval_lenpen``: the search BLEU
    is computed with while training (1 = greedy); ``eval_sentences``: score only the first N
    sentences of a split (None: all); ``eval_max_tokens``: tokens per evaluation batch;
    ``data_spec``: recorded in checkpoints.
    """

    metric_name = "bleu"

    def __init__(
        self,
        data: ParallelData,
        tokenizer: SubwordTokenizer | None = None,
        *,
        tokenizer_source: str | None = None,
        vocab_size: int = 8000,
        max_tokens: int = 4096,
        seed: int = 0,
        train_split: str = "train",
        valid_split: str = "val",
        test_split: str = "test_2016_flickr",
        eval_beam: int = 1,
        eval_lenpen: float = 1.0,
        eval_sentences: int | None = None,
        eval_max_tokens: int = 8192,
        data_spec: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(data, ParallelData):
            raise TypeError(f"data must be a ParallelData, got {type(data).__name__}")
        self.data = data
        self.src_lang, self.tgt_lang = data.src_lang, data.tgt_lang
        self.max_tokens = _positive_int("max_tokens", max_tokens)
        self.eval_max_tokens = _positive_int("eval_max_tokens", eval_max_tokens)
        self.eval_beam = _positive_int("eval_beam", eval_beam)
        self.eval_lenpen = float(eval_lenpen)
        if eval_sentences is not None:
            _positive_int("eval_sentences", eval_sentences)
        self.eval_sentences = eval_sentences
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.train_split, self.valid_split, self.test_split = train_split, valid_split, test_split
        self.data_spec = data_spec
        if tokenizer is None:
            _positive_int("vocab_size", vocab_size)
            train = self.train
            what = (
                f"training a joint {self.src_lang}-{self.tgt_lang} BPE vocabulary of {vocab_size} "
                f"on {len(train)} pairs"
            )
            with status(what, logger):
                tokenizer = train_joint_tokenizer(train, vocab_size=vocab_size)
        elif tokenizer_source is not None:
            check_pair(
                read_pair(tokenizer_source),
                self.src_lang,
                self.tgt_lang,
                tokenizer_source,
                direction=False,
            )
        if not isinstance(tokenizer, SubwordTokenizer):
            raise TypeError(f"tokenizer must be a SubwordTokenizer, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self._encoded: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self._batcher: TokenBatcher | None = None
        self._pending: dict[str, Any] | None = None

    # ---- data ----------------------------------------------------------------------------

    @property
    def train(self):
        """The training split (read on first use: evaluation alone never needs it)."""
        return self.data.split(self.train_split)

    def split_name(self, split: str) -> str:
        return (
            getattr(self, _SPLIT_ALIASES[split])
            if split in _SPLIT_ALIASES
            else (self.train_split if split == "train" else split)
        )

    def encoded(self, split: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Subword ids of each source and target sentence of ``split`` (no specials)."""
        name = self.split_name(split)
        if name not in self._encoded:
            s = self.data.split(name)
            with status(f"encoding the {len(s)} pairs of {name}", logger):
                src = [np.asarray(r, dtype=np.int64) for r in self.tokenizer.encode_ids(s.src)]
                tgt = [np.asarray(r, dtype=np.int64) for r in self.tokenizer.encode_ids(s.tgt)]
            self._encoded[name] = (src, tgt)
        return self._encoded[name]

    def _check_model(self, model: nn.Module) -> None:
        c = getattr(model, "config", None)
        if c is None:
            return
        if c.vocab_size != self.tokenizer.vocab_size:
            raise ValueError(
                f"the model's vocab_size is {c.vocab_size} but the tokenizer has "
                f"{self.tokenizer.vocab_size} ids; build the model with "
                f"vocab_size={self.tokenizer.vocab_size}"
            )
        t = self.tokenizer
        ids = {"pad_id": t.pad_id, "bos_id": t.bos_id, "eos_id": t.eos_id}
        for k, v in ids.items():
            if getattr(c, k, v) != v:
                raise ValueError(f"the model's {k} is {getattr(c, k)} but the tokenizer's is {v}")

    def _check_lengths(self, model: nn.Module) -> None:
        """Refuse training pairs that do not fit the model (source + EOS, BOS + target)."""
        limit = model.config.seq_len
        src, tgt = self.encoded("train")
        split = self.train
        for side, rows, path in (("source", src, split.src_path), ("target", tgt, split.tgt_path)):
            lengths = np.fromiter((len(r) + 1 for r in rows), dtype=np.int64, count=len(rows))
            over = np.flatnonzero(lengths > limit)
            if len(over):
                i = int(over[0])
                raise ValueError(
                    f"{path} line {i + 1}: the {side} sentence has {int(lengths[i])} tokens "
                    f"(with EOS/BOS), more than the model's seq_len={limit}; {len(over)} "
                    "training sentences are that long: build the model with a larger seq_len "
                    "or filter the corpus"
                )

    def collate(
        self, src: Sequence[np.ndarray], tgt: Sequence[np.ndarray] | None
    ) -> dict[str, Tensor]:
        """Padded tensors of sentence pairs: ``input_ids`` (B, S) = source + EOS, and with
        targets ``tgt_in`` (B, T) = BOS + target, ``targets`` (B, T) = target + EOS."""
        t = self.tokenizer
        b = len(src)
        s_len = max(len(r) for r in src) + 1
        input_ids = np.full((b, s_len), t.pad_id, dtype=np.int64)  # (B, S)
        for i, r in enumerate(src):
            input_ids[i, : len(r)] = r
            input_ids[i, len(r)] = t.eos_id
        out = {"input_ids": torch.from_numpy(input_ids)}
        if tgt is not None:
            t_len = max(len(r) for r in tgt) + 1
            tgt_in = np.full((b, t_len), t.pad_id, dtype=np.int64)  # (B, T)
            targets = np.full((b, t_len), t.pad_id, dtype=np.int64)  # (B, T)
            for i, r in enumerate(tgt):
                tgt_in[i, 0] = t.bos_id
                tgt_in[i, 1 : len(r) + 1] = r
                targets[i, : len(r)] = r
                targets[i, len(r)] = t.eos_id
            out["tgt_in"] = torch.from_numpy(tgt_in)
            out["targets"] = torch.from_numpy(targets)
        return out

    def _lengths(self, split: str) -> tuple[list[int], list[int]]:
        src, tgt = self.encoded(split)
        return [len(r) + 1 for r in src], [len(r) + 1 for r in tgt]

    # ---- the task protocol ---------------------------------------------------------------

    def train_batches(self, model: nn.Module, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        """This rank's rows of each token-budget batch (see the module docstring)."""
        self._check_model(model)
        self._check_lengths(model)
        src_len, tgt_len = self._lengths("train")
        batcher = TokenBatcher(src_len, tgt_len, self.max_tokens, seed=self.seed)
        if self._pending is not None:
            restore_position(batcher, self._pending["position"])
            self._pending = None
        self._batcher = batcher
        src, tgt = self.encoded("train")

        def _iterate() -> Iterator[Batch]:
            while True:
                index = next(batcher)
                if len(index) < world:
                    raise ValueError(
                        f"a batch of {len(index)} sentences cannot be shared by {world} "
                        "processes; raise max_tokens"
                    )
                mine = np.array_split(index, world)[rank]
                data = self.collate([src[i] for i in mine], [tgt[i] for i in mine])
                # the loss is a mean over target tokens: weigh rows by theirs (Batch.weights)
                weights = (data["targets"] != self.tokenizer.pad_id).sum(1)  # (B,)
                yield Batch(data, meta={"sentences": len(index)}, weights=weights)

        return _iterate()

    def forward(self, model: nn.Module, batch: Batch, state: Any) -> ModelOutput:
        if state is not None:
            raise ValueError("translation models are stateless between batches; state must be None")
        d = batch.data
        return model(d["input_ids"], d["tgt_in"], targets=d["targets"])

    @torch.no_grad()
    def loss(
        self,
        model: nn.Module,
        split: str,
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]:
        """Teacher-forced ``{"loss": label-smoothed, "nll", "ppl": exp(nll), "tokens"}`` per
        target token over ``split`` (its first ``eval_sentences`` pairs)."""
        from ..models.seq2seq import label_smoothed_nll

        src, tgt = self.encoded(split)
        n = len(src) if self.eval_sentences is None else min(len(src), self.eval_sentences)
        s_len, t_len = self._lengths(split)
        limit = model.config.seq_len
        keep = [i for i in range(n) if s_len[i] <= limit and t_len[i] <= limit]
        if len(keep) < n:
            logger.warning(
                "%d pairs of %s are longer than seq_len=%d: left out of the loss",
                n - len(keep),
                split,
                limit,
            )
        batcher = TokenBatcher(
            [s_len[i] for i in keep],
            [t_len[i] for i in keep],
            max(self.eval_max_tokens, limit),
            shuffle=False,
        )
        eps = model.config.label_smoothing
        pad = self.tokenizer.pad_id
        total = nll_total = 0.0
        count = 0
        for index in track(batcher.batches(0), desc=f"eval loss {split}", unit="batch"):
            rows = [keep[i] for i in index]
            data = self.collate([src[i] for i in rows], [tgt[i] for i in rows])
            data = {k: v.to(device) for k, v in data.items()}
            with autocast if autocast is not None else contextlib.nullcontext():
                out = model(data["input_ids"], data["tgt_in"])
            loss, nll = label_smoothed_nll(
                out.logits, data["targets"], eps, ignore=(pad,), with_nll=True
            )
            k = int((data["targets"] != pad).sum())
            total += float(loss.double()) * k
            nll_total += float(nll.double()) * k
            count += k
        nll = nll_total / count
        return {"loss": total / count, "nll": nll, "ppl": math.exp(nll), "tokens": count}

    def hypotheses(
        self,
        model: nn.Module,
        split: str,
        *,
        beam: int | None = None,
        lenpen: float | None = None,
        batch_size: int = 64,
        early_stopping: bool | None = None,
        progress: Callable[[int], None] | None = None,
        lenpen_form: str = "fairseq",
    ) -> tuple[list[str], list[str]]:
        """(detokenized hypotheses, references) for the sources of ``split``."""
        from ..generation import translate

        s = self.data.split(self.split_name(split))
        n = len(s) if self.eval_sentences is None else min(len(s), self.eval_sentences)
        beam = self.eval_beam if beam is None else beam
        lenpen = self.eval_lenpen if lenpen is None else lenpen
        bar = None
        if progress is None:
            bar = progress_bar(n, desc=f"translate {split} (beam {beam})", unit="sent")
            progress = lambda done: bar.update(done - bar.n)  # noqa: E731
        try:
            hyps = translate(
                model,
                s.src[:n],
                tokenizer=self.tokenizer,
                beam=beam,
                lenpen=lenpen,
                lenpen_form=lenpen_form,
                batch_size=batch_size,
                early_stopping=early_stopping if early_stopping is not None else beam > 1,
                progress=progress,
            )
        finally:
            if bar is not None:
                bar.close()
        return list(hyps), s.tgt[:n]

    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
        beam: int | None = None,
        lenpen: float | None = None,
    ) -> dict[str, Any]:
        """``{"bleu", "chrf", "loss", "nll", "ppl", "tokens", "sentences", "beam", signatures}``
        over ``split`` (the trainer's ``"valid"``/``"test"`` or any split name)."""
        from ..metrics import translation_scores

        was_training = model.training
        model.eval()
        try:
            result: dict[str, Any] = self.loss(model, split, device=device, autocast=autocast)
            hyps, refs = self.hypotheses(model, split, beam=beam, lenpen=lenpen)
        finally:
            model.train(was_training)
        result.update(translation_scores(hyps, refs))
        result["sentences"] = len(hyps)
        result["beam"] = self.eval_beam if beam is None else beam
        return result

    def state_dict(self) -> dict[str, Any]:
        if self._batcher is not None:
            position: dict[str, Any] | None = self._batcher.state_dict()
        elif self._pending is not None:
            position = self._pending["position"]
        else:
            position = None
        return {"fingerprint": self.train.fingerprint, "position": position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.train.fingerprint:
            raise ValueError(
                f"the saved data position is for a training split with fingerprint "
                f"{state.get('fingerprint')!r}, but {self.train.src_path} / {self.train.tgt_path} "
                f"({self.src_lang}->{self.tgt_lang}) have {self.train.fingerprint!r}; resume on "
                "the same data and direction"
            )
        self._batcher = None
        self._pending = None if state.get("position") is None else dict(state)

    def describe(self) -> dict[str, Any]:
        return {
            "task": "translation",
            "src": self.src_lang,
            "tgt": self.tgt_lang,
            "data": self.data_spec if self.data_spec is not None else {"path": str(self.data.root)},
            "train_split": self.train_split,
            "valid_split": self.valid_split,
            "test_split": self.test_split,
            "fingerprint": self.train.fingerprint,
            "vocab_size": self.tokenizer.vocab_size,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "eval_beam": self.eval_beam,
            "eval_lenpen": self.eval_lenpen,
            "eval_sentences": self.eval_sentences,
        }

    def artifacts(self) -> dict[str, bytes]:
        pair = {"src": self.src_lang, "tgt": self.tgt_lang}
        return {
            TOKENIZER_FILE: self.tokenizer.to_bytes(),
            PAIR_FILE: (json.dumps(pair) + "\n").encode(),
        }

    def __repr__(self) -> str:
        return (
            f"TranslationTask({self.data!r}, vocab={self.tokenizer.vocab_size}, "
            f"max_tokens={self.max_tokens})"
        )


# ------------------------------------------------------------------------------------------
# Run directories: what `effiformer eval` and `effiformer translate` call
# ------------------------------------------------------------------------------------------


def check_translation_model(model: nn.Module, where: Any) -> None:
    """Refuse what cannot translate: models of a family other than ``seq2seq`` and ``hat``, and
    a HAT SuperTransformer whose SubTransformer is not fixed (``config.sub``), with what to do
    instead (search it and export the SubTransformer found)."""
    family = getattr(getattr(model, "config", None), "family", None)
    if family == "seq2seq":
        return
    if family == "hat":
        if model.config.sub is not None:
            return
        raise ValueError(
            f"{where} holds a SuperTransformer (HAT): it translates as one of its "
            f"SubTransformers; search one under a latency limit and export it (effiformer search "
            f"evolve {where} --predictor PRED --latency-ms MS --export DIR), then use DIR"
        )
    raise ValueError(f"{where} holds a {family!r} model, not a translation model")


def load_translation_run(
    run: str | os.PathLike, *, device: torch.device | str = "cpu"
) -> tuple[nn.Module, SubwordTokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, meta) of a run directory or checkpoint. Refuses a run
    without ``tokenizer.json`` and a tokenizer whose size differs from the model's vocabulary.
    ``meta["pair"]``: the ``{"src", "tgt"}`` the model translates (None if not recorded)."""
    from ..checkpoint import load_checkpoint, resolve_checkpoint

    ckpt = resolve_checkpoint(run)
    if not (ckpt / TOKENIZER_FILE).is_file():
        raise TokenizerError(
            f"{ckpt} has no {TOKENIZER_FILE}: a translation checkpoint keeps its vocabulary "
            "beside the weights (was it trained with --task translation?)"
        )
    tokenizer = SubwordTokenizer.load(ckpt)
    model, meta = load_checkpoint(ckpt, map_location=device)
    check_translation_model(model, run)
    if model.config.vocab_size != tokenizer.vocab_size:
        raise TokenizerError(
            f"{ckpt}: the model has vocab_size={model.config.vocab_size} but its "
            f"{TOKENIZER_FILE} has {tokenizer.vocab_size} ids; the files are from different runs"
        )
    meta["pair"] = read_pair(ckpt)
    model.to(device).eval()
    return model, tokenizer, meta


def _atomic_write_lines(path: Path, lines: Sequence[str]) -> None:
    from ..checkpoint import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def evaluate_run(
    run: str | os.PathLike,
    split: str,
    *,
    data: str | os.PathLike | None = None,
    src: str | None = None,
    tgt: str | None = None,
    out: str | os.PathLike | None = None,
    beam: int | None = None,
    lenpen: float | None = None,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    progress: Callable[[int], None] | None = None,
    sentences: int | None = None,
    lenpen_form: str | None = None,
) -> dict[str, Any]:
    """BLEU and chrF of a run on ``split`` of ``data`` (default: the folder it was trained on),
    beam search; the hypotheses go to ``out`` (default ``RUN_CHECKPOINT/hyps/SPLIT.TGT``),
    written atomically after decoding. ``split``: ``"valid"`` / ``"test"`` (the splits the run
    was trained with) or any split name of the folder; ``sentences``: only the first N pairs.
    ``beam``, ``lenpen``, ``lenpen_form``: ``None`` takes the run's configuration's paper
    convention (:func:`~effiformer.recipes.decoding_for`; fairseq's beam 5, lenpen 1 for the
    others). Returns the record (scores, signatures, paths)."""
    model, tokenizer, meta = load_translation_run(run, device=device)
    beam, lenpen, lenpen_form, convention = resolve_decoding(
        meta.get("model_name"), beam, lenpen, lenpen_form
    )
    saved = meta.get("task", {})
    pair = meta.get("pair") or {"src": saved.get("src"), "tgt": saved.get("tgt")}
    src = src or pair["src"]
    tgt = tgt or pair["tgt"]
    if src is None or tgt is None:
        raise ValueError(f"{meta['path']} does not record its language pair: pass src and tgt")
    check_pair(pair if pair["src"] else None, src, tgt, meta["path"], direction=True)
    root = data if data is not None else (saved.get("data") or {}).get("path")
    if root is None:
        raise ValueError(f"{meta['path']} does not record its data folder: pass data")
    parallel = ParallelData(root, src, tgt)
    splits = {k: saved[k] for k in ("train_split", "valid_split", "test_split") if saved.get(k)}
    task = TranslationTask(
        parallel, tokenizer, eval_beam=beam, eval_lenpen=lenpen, eval_sentences=sentences, **splits
    )
    name = task.split_name(split)
    parallel.split(name)  # fails here, before decoding, on a missing or misaligned split
    target = Path(out) if out is not None else Path(meta["path"]) / "hyps" / f"{name}.{tgt}"
    result = task.loss(model, name, device=device)
    hyps, refs = task.hypotheses(
        model,
        name,
        beam=beam,
        lenpen=lenpen,
        lenpen_form=lenpen_form,
        batch_size=batch_size,
        early_stopping=False,
        progress=progress,
    )
    from ..metrics import translation_scores

    result.update(translation_scores(hyps, refs))
    _atomic_write_lines(target, hyps)
    return {
        "checkpoint": meta["path"],
        "step": meta.get("step"),
        "model": meta.get("model_name"),
        "split": name,
        "src": src,
        "tgt": tgt,
        "beam": beam,
        "lenpen": lenpen,
        "lenpen_form": lenpen_form,
        "decoding": convention,
        "sentences": len(hyps),
        "hypotheses": str(target),
        **result,
    }


def translate_file(
    run: str | os.PathLike,
    lines: Sequence[str],
    *,
    src: str | None = None,
    tgt: str | None = None,
    beam: int | None = None,
    lenpen: float | None = None,
    batch_size: int = 64,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    device: torch.device | str = "cpu",
    progress: Callable[[int], None] | None = None,
    lenpen_form: str | None = None,
) -> list[str]:
    """Translations of ``lines`` (one sentence each; an empty line gives an empty line) by the
    run's model, in order. ``src`` / ``tgt``: the direction the caller expects (checked
    against the run's). Sentences longer than the model's limit are truncated with a warning.
    ``beam``, ``lenpen``, ``lenpen_form``: ``None`` takes the configuration's convention."""
    model, tokenizer, meta = load_translation_run(run, device=device)
    beam, lenpen, lenpen_form, _ = resolve_decoding(
        meta.get("model_name"), beam, lenpen, lenpen_form
    )
    pair = meta.get("pair")
    if pair is not None and (src is not None or tgt is not None):
        check_pair(pair, src or pair["src"], tgt or pair["tgt"], meta["path"], direction=True)
    texts = [line.rstrip("\r\n").strip() for line in lines]
    from ..generation import translate

    return list(
        translate(
            model,
            texts,
            tokenizer=tokenizer,
            beam=beam,
            lenpen=lenpen,
            lenpen_form=lenpen_form,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            batch_size=batch_size,
            progress=progress,
        )
    )


def resolve_decoding(
    model_name: str | None,
    beam: int | None = None,
    lenpen: float | None = None,
    lenpen_form: str | None = None,
) -> tuple[int, float, str, str]:
    """``(beam, lenpen, lenpen_form, where from)``: each value given, else that of the paper
    convention registered for ``model_name`` (:func:`~effiformer.recipes.decoding_for`);
    ``where from`` says which were taken from which convention."""
    from ..recipes import decoding_for

    conv = decoding_for(model_name)
    taken = [n for n, v in (("beam", beam), ("lenpen", lenpen), ("lenpen_form", lenpen_form))
             if v is None]  # fmt: skip
    beam = conv.beam if beam is None else beam
    lenpen = conv.lenpen if lenpen is None else float(lenpen)
    lenpen_form = conv.lenpen_form if lenpen_form is None else lenpen_form
    where = f"{', '.join(taken)} from {conv.source}" if taken else "all given"
    return beam, lenpen, lenpen_form, where


# ------------------------------------------------------------------------------------------
# Registration: `effiformer train NAME --task translation`, `effiformer eval RUN`
# ------------------------------------------------------------------------------------------


def _check_opt_positive(name: str, value: Any) -> None:
    if value is not None:
        _positive_int(name, value)


@dataclass(frozen=True, kw_only=True)
class TranslationOptions:
    """Options of the ``translation`` task (``effiformer train NAME --task translation``)."""

    data: str = task_option(
        help="parallel corpus folder: SPLIT.SRC / SPLIT.TGT files, plain or .gz (Multi30k's "
        "layout)",
        metavar="DIR",
    )
    src: str = task_option(help="source language: the files' suffix, e.g. en", metavar="LANG")
    tgt: str = task_option(help="target language: the files' suffix, e.g. de", metavar="LANG")
    max_tokens: int = task_option(
        4096, "padded tokens per batch (rows x the longer side), fairseq's --max-tokens"
    )
    vocab_size: int = task_option(8000, "joint BPE vocabulary size, trained on the training split")
    tokenizer: str | None = task_option(
        None,
        "an existing tokenizer.json, or a run holding one (default: train a joint BPE)",
        metavar="PATH",
    )
    train_split: str = task_option("train", "training split of --data", metavar="SPLIT")
    valid_split: str = task_option("val", "split evaluated during training", metavar="SPLIT")
    test_split: str = task_option(
        "test_2016_flickr", "what `effiformer eval --split test` scores", metavar="SPLIT"
    )
    eval_beam: int = task_option(1, "beam of the BLEU computed during training (1 = greedy)")
    eval_lenpen: float = task_option(1.0, "length penalty of the BLEU computed during training")
    eval_sentences: int | None = task_option(
        None, "evaluate during training on the first N sentences (default: all)", metavar="N"
    )

    def __post_init__(self) -> None:
        for name in ("max_tokens", "vocab_size", "eval_beam"):
            _positive_int(name, getattr(self, name))
        _check_opt_positive("eval_sentences", self.eval_sentences)
        if self.src == self.tgt:
            raise ValueError(f"--src and --tgt are the same language ({self.src!r})")


@dataclass(frozen=True, kw_only=True)
class TranslationEvalOptions:
    """Options of ``effiformer eval`` for a checkpoint of the ``translation`` task."""

    data: str | None = task_option(
        None, "parallel corpus folder (default: the one recorded at training)", metavar="PATH"
    )
    beam: int | None = task_option(
        None, "beam size (1 = greedy; default: the configuration's paper convention, else 5)"
    )
    lenpen: float | None = task_option(
        None, "length penalty (default: the configuration's paper convention, else 1)"
    )
    lenpen_form: str | None = task_option(
        None,
        "fairseq (score / length ** lenpen) or gnmt (score / ((5 + length) / 6) ** lenpen, "
        "Vaswani et al.'s); default: the configuration's paper convention, else fairseq",
        metavar="FORM",
    )
    batch: int | None = task_option(None, "sentences per decoding batch (default 64)")
    eval_sentences: int | None = task_option(
        None, "score only the first N sentences of the split (default: all)", metavar="N"
    )
    out: str | None = task_option(
        None, "file for the hypotheses (default: CHECKPOINT/hyps/SPLIT.TGT)", metavar="FILE"
    )

    def __post_init__(self) -> None:
        from ..recipes import LENPEN_FORMS

        _check_opt_positive("beam", self.beam)
        if self.lenpen_form is not None and self.lenpen_form not in LENPEN_FORMS:
            raise ValueError(
                f"--lenpen-form must be one of {list(LENPEN_FORMS)}, got {self.lenpen_form!r}"
            )
        _check_opt_positive("batch", self.batch)
        _check_opt_positive("eval_sentences", self.eval_sentences)


def build_translation(options: TranslationOptions, context: BuildContext) -> TaskSetup:
    """The ``translation`` task: the parallel folder, the joint vocabulary (trained, given, or
    the resumed run's), and the registered encoder-decoder ``context.model_name`` with
    ``vocab_size`` from the vocabulary and the ``--set`` overrides (a resumed run: its config)."""
    from ..checkpoint import load_config
    from ..config import ConfigError, parse_overrides, replace_config
    from ..registry import build_model, get_config, get_spec, list_models

    name = context.model_name
    if context.resume is not None:
        base = load_config(context.resume)
        tokenizer: SubwordTokenizer | None = SubwordTokenizer.load(context.resume)
        source: str | None = str(context.resume)
    elif name is None:
        raise ValueError(
            "give a registered encoder-decoder model NAME (e.g. transformer-multi30k) or --resume"
        )
    else:
        base = get_spec(name).config
        source = options.tokenizer
        tokenizer = SubwordTokenizer.load(source) if source is not None else None
    if base.family not in ("seq2seq", "hat"):
        models = ", ".join(n for n in list_models() if get_spec(n).family in ("seq2seq", "hat"))
        raise ValueError(
            f"--task translation trains encoder-decoder models (families seq2seq and hat: "
            f"{models}); {name!r} is a {base.family!r} model"
        )
    overrides = parse_overrides(base, context.overrides)
    data = ParallelData(options.data, options.src, options.tgt)
    task = TranslationTask(
        data,
        tokenizer,
        tokenizer_source=source,
        vocab_size=options.vocab_size,
        max_tokens=options.max_tokens,
        seed=context.seed,
        train_split=options.train_split,
        valid_split=options.valid_split,
        test_split=options.test_split,
        eval_beam=options.eval_beam,
        eval_lenpen=options.eval_lenpen,
        eval_sentences=options.eval_sentences,
        data_spec={"path": str(Path(options.data).resolve())},
    )
    size = task.tokenizer.vocab_size
    if "vocab_size" in overrides and overrides["vocab_size"] != size:
        raise ConfigError(
            f"--set vocab_size={overrides['vocab_size']} disagrees with the vocabulary, which has "
            f"{size} ids (vocab_size is set from it; drop the override)"
        )
    if context.resume is None:
        overrides["vocab_size"] = size
        model_config = get_config(str(name), **overrides)
    else:
        model_config = replace_config(base, **overrides) if overrides else base
    torch.manual_seed(context.seed)
    model = build_model(model_config)
    task._check_model(model)
    data_name = f"{Path(options.data).name} {options.src}->{options.tgt}"
    if base.family == "hat":
        # a SuperTransformer: one SubTransformer sampled per update (HAT sec. 3.1), evaluated
        # as its largest and smallest SubTransformers
        from .supernet import SuperNetTask

        return TaskSetup(
            task=SuperNetTask(task, seed=context.seed),
            model=model,
            model_name=str(name),
            data_name=f"{data_name} (SuperTransformer)",
        )
    return TaskSetup(task=task, model=model, model_name=str(name), data_name=data_name)


def evaluate_translation(
    checkpoint: Path,
    meta: dict[str, Any],
    options: TranslationEvalOptions,
    *,
    split: str = "valid",
    device: str = "auto",
) -> EvalReport:
    """Corpus BLEU and chrF (sacreBLEU, with their signatures) of a translation checkpoint on
    ``split`` by beam search (:func:`evaluate_run`); the hypotheses are written to a file."""
    from .base import resolve_device

    dev = resolve_device(device)
    record = evaluate_run(
        checkpoint,
        split,
        data=options.data,
        out=options.out,
        beam=options.beam,
        lenpen=options.lenpen,
        lenpen_form=options.lenpen_form,
        batch_size=options.batch or 64,
        device=dev,
        sentences=options.eval_sentences,
    )
    record = {"task": "translation", **record}
    summary = (
        f"{record['model']} step {record['step']}: {record['split']} {record['src']}->"
        f"{record['tgt']} BLEU {record['bleu']:.2f} chrF {record['chrf']:.2f} (beam "
        f"{record['beam']}, lenpen {record['lenpen']:g} {record['lenpen_form']}, "
        f"{record['sentences']} sentences); hypotheses in {record['hypotheses']}\n"
        f"BLEU signature: {record['bleu_signature']}\nchrF signature: {record['chrf_signature']}"
    )
    if "bleu_tok" in record:  # the papers' convention, beside sacreBLEU's headline figure
        summary += (
            f"\ntokenized compound-split BLEU (the WMT papers' convention) {record['bleu_tok']:.2f}"
            f": {record['bleu_tok_signature']}"
        )
    summary += f"\ndecoding: {record['decoding']}"
    return EvalReport(record=record, summary=summary)


register_task(
    "translation",
    TranslationOptions,
    build_translation,
    description="translation --src -> --tgt on the parallel folder --data (a joint BPE "
    "vocabulary is trained and saved; BLEU by sacreBLEU)",
    eval_options=TranslationEvalOptions,
    evaluate=evaluate_translation,
)
