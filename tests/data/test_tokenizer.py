"""Subword tokenizer: training, specials, single/pair encoding, truncation, files and errors."""

from __future__ import annotations

import json

import pytest
import torch

from effiformer.data.tokenizer import (
    CLS_TOKEN_TYPE_ID,
    SPECIAL_TOKENS,
    TOKENIZER_FILE,
    SubwordTokenizer,
    TokenizerError,
)

TEXTS = [
    "the cat sat on the mat .",
    "the dog sat on the log .",
    "a charming and often affecting journey .",
    "unflinchingly bleak and desperate",
    "the cats and the dogs are sitting on the mats",
    "it is a journey , not a destination .",
] * 20


@pytest.fixture(scope="module")
def tok() -> SubwordTokenizer:
    return SubwordTokenizer.train(TEXTS, vocab_size=200, min_frequency=1)


def _ids(tok: SubwordTokenizer, text: str) -> list[int]:
    return tok.encode_ids([text])[0]


def test_specials_have_fixed_ids(tok: SubwordTokenizer) -> None:
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert 5 < tok.vocab_size <= 200


def test_wordpiece_splits_and_decodes(tok: SubwordTokenizer) -> None:
    # Lowercased; every word of the training text is a single piece, a new word is split.
    assert tok.tokenize("The CAT sat") == ["the", "cat", "sat"]
    pieces = tok.tokenize("catdog")
    assert len(pieces) > 1 and all(p.startswith("##") for p in pieces[1:])
    assert tok.decode(_ids(tok, "the cats sat on the mats")) == "the cats sat on the mats"
    # A character never seen in training is [UNK].
    assert _ids(tok, "€") == [tok.unk_id]


def test_single_encoding_exact(tok: SubwordTokenizer) -> None:
    a = _ids(tok, "the cat sat")
    enc = tok.encode(["the cat sat", "the"], max_len=8)
    expected_ids = torch.tensor(
        [[2, *a, 3] + [0] * (8 - len(a) - 2), [2, _ids(tok, "the")[0], 3, 0, 0, 0, 0, 0]]
    )
    torch.testing.assert_close(enc.input_ids, expected_ids)
    types = torch.zeros(2, 8, dtype=torch.int64)
    types[:, 0] = CLS_TOKEN_TYPE_ID
    torch.testing.assert_close(enc.token_type_ids, types)
    torch.testing.assert_close(enc.attention_mask, (expected_ids != 0).long())
    assert enc.input_ids.dtype == torch.int64 and len(enc) == 2


def test_pair_encoding_exact(tok: SubwordTokenizer) -> None:
    a, b = _ids(tok, "the cat"), _ids(tok, "a dog sat")
    enc = tok.encode("the cat", "a dog sat", max_len=12)
    row = [2, *a, 3, *b, 3]
    pad = 12 - len(row)
    torch.testing.assert_close(enc.input_ids, torch.tensor([row + [0] * pad]))
    types = [CLS_TOKEN_TYPE_ID] + [0] * (len(a) + 1) + [1] * (len(b) + 1) + [0] * pad
    torch.testing.assert_close(enc.token_type_ids, torch.tensor([types]))
    torch.testing.assert_close(enc.attention_mask, torch.tensor([[1] * len(row) + [0] * pad]))
    bert = tok.encode("the cat", "a dog sat", max_len=12, cls_token_type_id=0)
    assert bert.token_type_ids[0, 0].item() == 0
    torch.testing.assert_close(bert.token_type_ids[:, 1:], enc.token_type_ids[:, 1:])


def test_truncation_longest_first_and_longest_padding(tok: SubwordTokenizer) -> None:
    a = _ids(tok, "the cat sat on the mat")  # 6 pieces
    b = _ids(tok, "a dog")  # 2 pieces
    enc = tok.encode("the cat sat on the mat", "a dog", max_len=9)  # room for 6 of 8 pieces
    # The longer segment loses tokens from its end until it is no longer longer (4 + 2 = 6).
    assert enc.input_ids[0].tolist() == [2, *a[:4], 3, *b, 3]
    tie = tok.encode("the cat", "the dog", max_len=6)  # 2 + 2 pieces, room for 3: b loses one
    assert tie.input_ids[0].tolist() == [2, *_ids(tok, "the cat"), 3, _ids(tok, "the")[0], 3]
    single = tok.encode("the cat sat on the mat", max_len=5)
    assert single.input_ids[0].tolist() == [2, *a[:3], 3]
    longest = tok.encode(["the cat", "the cat sat on"], padding="longest", max_len=64)
    assert longest.input_ids.shape == (2, 2 + len(_ids(tok, "the cat sat on")))


def test_save_load_round_trip(tok: SubwordTokenizer, tmp_path) -> None:
    path = tok.save(tmp_path / "ckpt")
    assert path == tmp_path / "ckpt" / TOKENIZER_FILE and path.is_file()
    for where in (tmp_path / "ckpt", path):
        back = SubwordTokenizer.load(where)
        assert back.vocab_size == tok.vocab_size
        for x, y in [("the cats sat", "on a log ."), ("unflinchingly desperate", "€ catdog")]:
            e1, e2 = tok.encode(x, y, max_len=16), back.encode(x, y, max_len=16)
            torch.testing.assert_close(e1.input_ids, e2.input_ids)
            torch.testing.assert_close(e1.token_type_ids, e2.token_type_ids)
            torch.testing.assert_close(e1.attention_mask, e2.attention_mask)
    # The file's own post-processor encodes the same template (HF tokenizers can read it).
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(path)).encode("the cat", "a dog")
    ours = tok.encode("the cat", "a dog", padding="longest")
    assert raw.ids == ours.input_ids[0].tolist()
    assert raw.type_ids == ours.token_type_ids[0].tolist()


def test_bpe_option_is_reproducible(tmp_path) -> None:
    one = SubwordTokenizer.train(TEXTS, vocab_size=120, algorithm="bpe", min_frequency=1)
    two = SubwordTokenizer.train(TEXTS, vocab_size=120, algorithm="bpe", min_frequency=1)
    assert [one.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    p1, p2 = one.save(tmp_path / "a.json"), two.save(tmp_path / "b.json")
    assert p1.read_bytes() == p2.read_bytes()
    assert one.decode(_ids(one, "the cats sat on the mats")) == "the cats sat on the mats"


def test_missing_and_corrupt_files(tmp_path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer file 'tokenizer.json'"):
        SubwordTokenizer.load(tmp_path)
    with pytest.raises(TokenizerError, match="nope.json"):
        SubwordTokenizer.load(tmp_path / "nope.json")
    bad = tmp_path / TOKENIZER_FILE
    bad.write_text('{"version": "1.0", "model": ')
    with pytest.raises(TokenizerError, match="not a valid tokenizer file"):
        SubwordTokenizer.load(tmp_path)
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(TokenizerError, match="not a valid HF tokenizers file"):
        SubwordTokenizer.load(bad)


def test_wrong_special_ids_rejected(tmp_path) -> None:
    from tokenizers import Tokenizer, models

    t = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2}, unk_token="[UNK]"))
    path = tmp_path / "t.json"
    t.save(str(path))
    with pytest.raises(TokenizerError, match=r"t\.json: special token \[PAD\] must have id 0"):
        SubwordTokenizer.load(path)


def test_bad_arguments(tok: SubwordTokenizer) -> None:
    with pytest.raises(ValueError, match="max_len must be an int >= 4"):
        tok.encode("a", "b", max_len=3)
    with pytest.raises(ValueError, match="pairs must have one text per entry"):
        tok.encode(["a", "b"], ["c"])
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        tok.encode(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="padding must be"):
        tok.encode("a", padding="left")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="algorithm must be"):
        SubwordTokenizer.train(TEXTS, algorithm="unigram")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="texts is empty"):
        SubwordTokenizer.train([], vocab_size=100)
