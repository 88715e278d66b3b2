"""Subword tokenizer (WordPiece by default, BPE option) trained with HF ``tokenizers``.

BERT / Funnel-Transformer conventions (Devlin et al. 2019, arXiv 1810.04805, section 3;
Dai et al. 2020, arXiv 2006.03236, and its official code):

* special tokens with fixed ids ``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4``;
* a single sentence is ``[CLS] a [SEP]``, a pair ``[CLS] a [SEP] b [SEP]``;
* ``token_type_ids`` are 0 for the first segment (with its ``[SEP]``), 1 for the second, and
  :data:`CLS_TOKEN_TYPE_ID` = 2 for ``[CLS]`` (the Funnel convention: the official code and HF's
  ``FunnelTokenizer`` give ``[CLS]`` its own segment id, so the model has ``type_vocab_size=3``).
  Pass ``cls_token_type_id=0`` to :meth:`SubwordTokenizer.encode` for the BERT convention;
* text is NFD-normalised, accents stripped and lowercased by default (BERT uncased).

For translation, ``train(..., algorithm="bpe", text="raw")`` keeps the text as it is (NFC
normalisation only: case and accents stay) and splits it only at spaces and around punctuation
(``▁`` marks a word start, SentencePiece style), so ``decode(encode_ids(s))`` gives ``s`` back
for any text made of characters seen in training (sacreBLEU scores detokenized text). The same
special tokens serve: ``[CLS]`` is the decoder's BOS (:attr:`SubwordTokenizer.bos_id`) and
``[SEP]`` the EOS (:attr:`SubwordTokenizer.eos_id`), i.e. ``[CLS] y [SEP]``.

Truncation is "longest first" (drop the last token of the longer segment until the pair fits),
as in HF ``truncation="longest_first"``. The tokenizer is saved as one HF ``tokenizer.json``
(the post-processor in the file encodes the same template, so HF ``PreTrainedTokenizerFast`` can
read it too); :meth:`SubwordTokenizer.load` checks the special tokens' ids.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from torch import Tensor

__all__ = [
    "CLS_TOKEN_TYPE_ID",
    "Encoding",
    "SPECIAL_TOKENS",
    "SubwordTokenizer",
    "TOKENIZER_FILE",
    "TokenizerError",
]

logger = logging.getLogger(__name__)

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
CLS_TOKEN_TYPE_ID = 2
TOKENIZER_FILE = "tokenizer.json"

Algorithm = Literal["wordpiece", "bpe"]
TextMode = Literal["bert", "raw"]
PathLike = str | os.PathLike[str]


class TokenizerError(ValueError):
    """A missing, corrupt or incompatible tokenizer file; the message names the path."""


@dataclass(frozen=True)
class Encoding:
    """A padded batch. Every field is an int64 tensor of shape ``(B, T)``.

    ``attention_mask`` is 1 on real tokens (specials included) and 0 on padding.
    """

    input_ids: Tensor
    token_type_ids: Tensor
    attention_mask: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class SubwordTokenizer:
    """A trained HF ``tokenizers.Tokenizer`` with the special tokens at ids 0-4.

    Build with :meth:`train` or :meth:`load`; wrapping an existing ``tokenizers.Tokenizer`` checks
    the special tokens' ids.
    """

    pad_id = PAD_ID
    unk_id = UNK_ID
    cls_id = CLS_ID
    sep_id = SEP_ID
    mask_id = MASK_ID
    bos_id = CLS_ID  # sequence-to-sequence: the decoder starts from [CLS] ...
    eos_id = SEP_ID  # ... and every sentence ends in [SEP]
    special_ids: tuple[int, ...] = tuple(range(len(SPECIAL_TOKENS)))

    def __init__(self, tokenizer: Tokenizer, *, source: str = "<memory>") -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer)}")
        for i, tok in enumerate(SPECIAL_TOKENS):
            got = tokenizer.token_to_id(tok)
            if got != i:
                raise TokenizerError(
                    f"{source}: special token {tok} must have id {i}, got {got} "
                    f"(expected the specials {list(SPECIAL_TOKENS)} at ids 0-4)"
                )
        self._tok = tokenizer
        self.source = source

    # ---- training and files --------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int = 8000,
        algorithm: Algorithm = "wordpiece",
        lowercase: bool = True,
        min_frequency: int = 2,
        text: TextMode = "bert",
    ) -> SubwordTokenizer:
        """Train on ``texts`` (an iterable of strings: lines, sentences or documents).

        ``vocab_size`` counts the 5 special tokens; the trained vocabulary can be smaller when the
        corpus has fewer distinct subwords. ``algorithm``: ``"wordpiece"`` (BERT, default;
        continuation pieces start with ``##``) or ``"bpe"`` (Sennrich et al. 2016; word-initial
        pieces start with ``▁`` as in SentencePiece). Both split on whitespace and punctuation first
        (BERT pre-tokenizer), so decoded text has spaces around punctuation.

        ``text="raw"`` (BPE only; translation): NFC normalisation instead of BERT's (lowercased
        only with ``lowercase=True``, accents kept), split at spaces (``▁`` starts a word) and
        around punctuation without losing where the spaces were, so decoding restores the text
        exactly.

        Reproducibility: with ``tokenizers`` 0.23 WordPiece training is *not* bit-reproducible
        across processes (count ties are broken in hash-map order; huggingface/tokenizers#1794),
        while this BPE setup is. Save the trained tokenizer beside the checkpoint and load it for
        fine-tuning and evaluation; never retrain it.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 32:
            raise ValueError(f"vocab_size must be an int >= 32, got {vocab_size!r}")
        if isinstance(min_frequency, bool) or not isinstance(min_frequency, int):
            raise ValueError(f"min_frequency must be an int, got {min_frequency!r}")
        specials = list(SPECIAL_TOKENS)
        if algorithm == "wordpiece":
            tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=specials,
                continuing_subword_prefix="##",
                show_progress=False,
            )
        elif algorithm == "bpe":
            tok = Tokenizer(models.BPE(unk_token="[UNK]"))
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=specials,
                show_progress=False,
            )
        else:
            raise ValueError(f"algorithm must be 'wordpiece' or 'bpe', got {algorithm!r}")
        if text not in ("bert", "raw"):
            raise ValueError(f"text must be 'bert' or 'raw', got {text!r}")
        if text == "raw":
            if algorithm != "bpe":
                raise ValueError("text='raw' needs algorithm='bpe'")
            steps = [normalizers.NFC()] + ([normalizers.Lowercase()] if lowercase else [])
            tok.normalizer = normalizers.Sequence(steps)
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation("isolated")]
            )
            tok.decoder = decoders.Metaspace()
        else:
            tok.normalizer = normalizers.BertNormalizer(
                clean_text=True,
                handle_chinese_chars=True,
                strip_accents=lowercase,
                lowercase=lowercase,
            )
            if algorithm == "wordpiece":
                tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
                tok.decoder = decoders.WordPiece(prefix="##")
            else:  # word starts carry "▁" (SentencePiece style), so decoding restores the spaces
                tok.pre_tokenizer = pre_tokenizers.Sequence(
                    [pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Metaspace()]
                )
                tok.decoder = decoders.Metaspace()
        n = 0

        def _iter() -> Iterable[str]:
            nonlocal n
            for t in texts:
                if not isinstance(t, str):
                    raise TypeError(f"texts must be strings, got {type(t).__name__} at item {n}")
                n += 1
                yield t

        tok.train_from_iterator(_iter(), trainer=trainer)
        if n == 0:
            raise ValueError("texts is empty: cannot train a tokenizer on no text")
        tok.post_processor = processors.TemplateProcessing(
            single=f"[CLS]:{CLS_TOKEN_TYPE_ID} $A:0 [SEP]:0",
            pair=f"[CLS]:{CLS_TOKEN_TYPE_ID} $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", CLS_ID), ("[SEP]", SEP_ID)],
        )
        out = cls(tok, source=f"<trained {algorithm} on {n} texts>")
        logger.info("trained a %s tokenizer: vocab %d from %d texts", algorithm, out.vocab_size, n)
        return out

    def save(self, path: PathLike) -> Path:
        """Write ``tokenizer.json`` into the directory ``path`` (created if needed), or to ``path``
        itself when it ends in ``.json``. Returns the file written. The write is atomic."""
        from ..checkpoint import atomic_write_bytes

        p = Path(path)
        if p.suffix != ".json":
            p.mkdir(parents=True, exist_ok=True)
            p = p / TOKENIZER_FILE
        atomic_write_bytes(p, self._tok.to_str(pretty=False).encode("utf-8"))
        return p

    def to_bytes(self) -> bytes:
        """The ``tokenizer.json`` that :meth:`save` writes, as bytes (a checkpoint artifact)."""
        return self._tok.to_str(pretty=False).encode("utf-8")

    @classmethod
    def load(cls, path: PathLike) -> SubwordTokenizer:
        """Read a tokenizer saved by :meth:`save`: a ``tokenizer.json`` file or a directory (for
        example a checkpoint directory) holding one."""
        p = Path(path)
        if p.is_dir():
            p = p / TOKENIZER_FILE
        if not p.is_file():
            where = f"{path}" if p.name != TOKENIZER_FILE else f"{p.parent}"
            raise TokenizerError(
                f"{where}: no tokenizer file {p.name!r} (train one and save it beside the "
                "checkpoint)"
            )
        try:
            raw = p.read_text(encoding="utf-8")
            json.loads(raw)
            tok = Tokenizer.from_str(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerError(f"{p}: not a valid tokenizer file ({e})") from None
        except Exception as e:  # tokenizers raises a bare Exception on a bad schema
            raise TokenizerError(f"{p}: not a valid HF tokenizers file ({e})") from None
        return cls(tok, source=str(p))

    # ---- encoding ------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included (ids are ``0 .. vocab_size - 1``)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def tokenize(self, text: str) -> list[str]:
        """The subword strings of ``text`` (no special tokens)."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Subword ids of each text, without special tokens, truncation or padding."""
        texts = _check_texts(texts, "texts")
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | Tensor, *, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def encode(
        self,
        texts: Sequence[str] | str,
        pairs: Sequence[str] | str | None = None,
        *,
        max_len: int = 128,
        padding: Literal["max_length", "longest"] = "max_length",
        cls_token_type_id: int = CLS_TOKEN_TYPE_ID,
    ) -> Encoding:
        """Encode sentences (``[CLS] a [SEP]``) or sentence pairs (``[CLS] a [SEP] b [SEP]``).

        ``texts``/``pairs``: one string or a sequence of B strings. Each row is truncated to
        ``max_len`` tokens (specials included; longest segment first) and right-padded with
        ``[PAD]`` to ``max_len`` (``padding="max_length"``) or to the longest row. Returns an
        :class:`Encoding` of ``(B, T)`` tensors.
        """
        if isinstance(texts, str):
            texts = [texts]
        if isinstance(pairs, str):
            pairs = [pairs]
        texts = _check_texts(texts, "texts")
        n_special = 2 if pairs is None else 3
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < n_special + 1:
            raise ValueError(f"max_len must be an int >= {n_special + 1}, got {max_len!r}")
        if padding not in ("max_length", "longest"):
            raise ValueError(f"padding must be 'max_length' or 'longest', got {padding!r}")
        a_ids = self.encode_ids(texts)
        if pairs is None:
            b_ids: list[list[int]] | None = None
        else:
            pairs = _check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise ValueError(
                    f"pairs must have one text per entry of texts ({len(texts)}), got {len(pairs)}"
                )
            b_ids = self.encode_ids(pairs)
        rows: list[tuple[list[int], list[int]]] = []
        budget = max_len - n_special
        for i, a in enumerate(a_ids):
            b = [] if b_ids is None else b_ids[i]
            a, b = _truncate_longest_first(a, b, budget)
            ids = [CLS_ID, *a, SEP_ID]
            types = [cls_token_type_id] + [0] * (len(a) + 1)
            if b_ids is not None:
                ids += [*b, SEP_ID]
                types += [1] * (len(b) + 1)
            rows.append((ids, types))
        width = max_len if padding == "max_length" else max(len(r[0]) for r in rows)
        input_ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)  # (B, T)
        token_types = np.zeros((len(rows), width), dtype=np.int64)  # (B, T)
        mask = np.zeros((len(rows), width), dtype=np.int64)  # (B, T)
        for r, (ids, types) in enumerate(rows):
            input_ids[r, : len(ids)] = ids
            token_types[r, : len(types)] = types
            mask[r, : len(ids)] = 1
        return Encoding(
            input_ids=torch.from_numpy(input_ids),
            token_type_ids=torch.from_numpy(token_types),
            attention_mask=torch.from_numpy(mask),
        )

    def __repr__(self) -> str:
        return f"SubwordTokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


def _check_texts(texts: Sequence[str], name: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a sequence of strings, got {type(texts).__name__}")
    out = list(texts)
    if not out:
        raise ValueError(f"{name} is empty")
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return out


def _truncate_longest_first(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Drop tokens from the end of the longer of ``a``/``b`` (``b`` on ties, as HF's
    ``truncation="longest_first"``) until they fit in ``budget``."""
    la, lb = len(a), len(b)
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return a[:la], b[:lb]
