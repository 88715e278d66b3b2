"""MLM/ELECTRA pretraining: exact seeded masking, specials never masked, the 80/10/10 split,
windows with [CLS]/[SEP], corpora decoded to text, resumable batches, and the trainer."""

from __future__ import annotations

import torch

from effiformer import create_model
from effiformer.config import replace_config
from effiformer.data import Corpus, Vocab
from effiformer.data.tokenizer import SubwordTokenizer
from effiformer.models.funnel import FunnelElectra
from effiformer.registry import get_config
from effiformer.tasks import Task
from effiformer.tasks.mlm import MLMTask, corpus_texts, mask_tokens, read_texts
from effiformer.train import TrainConfig, train

SENTENCES = [
    "the cat sat on the mat and looked at the dog .",
    "a dog ran in the park with a red ball .",
    "it is a charming and often affecting journey .",
    "the film is unflinchingly bleak and desperate .",
    "we walked along the river until the sun went down .",
] * 40


# One tokenizer for every task here: WordPiece training is not bit-reproducible across calls
# (huggingface/tokenizers#1794), which is why a run saves its tokenizer.
_TOKENIZER = SubwordTokenizer.train(SENTENCES, vocab_size=120, min_frequency=1)


def _task(**kw) -> MLMTask:
    tok = _TOKENIZER
    kw.setdefault("batch_size", 4)
    kw.setdefault("seq_len", 16)
    return MLMTask.from_texts(SENTENCES[:150], SENTENCES[150:], tok, **kw)


def test_masking_is_exact_for_a_seed() -> None:
    ids = torch.randint(5, 100, (8, 32), generator=torch.Generator().manual_seed(1))
    ids[:, 0], ids[:, -1], ids[0, 10:] = 2, 3, 0  # [CLS] ... [SEP], padding
    m1, t1 = mask_tokens(ids, vocab_size=100, generator=torch.Generator().manual_seed(7))
    m2, t2 = mask_tokens(ids, vocab_size=100, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(m1, m2)
    torch.testing.assert_close(t1, t2)
    m3, _ = mask_tokens(ids, vocab_size=100, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(m1, m3)
    # Recompute the documented draws by hand: selection, 80/10/10, random ids, in that order.
    g = torch.Generator().manual_seed(7)
    sel = (torch.rand(ids.shape, generator=g) < 0.15) & (ids >= 5)
    act = torch.rand(ids.shape, generator=g)
    rnd = torch.randint(5, 100, ids.shape, generator=g)
    expected = torch.where(sel & (act < 0.8), torch.full_like(ids, 4), ids)
    expected = torch.where(sel & (act >= 0.8) & (act < 0.9), rnd, expected)
    torch.testing.assert_close(m1, expected)
    torch.testing.assert_close(t1, torch.where(sel, ids, torch.full_like(ids, -100)))
    # Specials (ids < 5: [PAD] [UNK] [CLS] [SEP] [MASK]) are never selected nor changed.
    special = ids < 5
    torch.testing.assert_close(m1[special], ids[special])
    assert (t1[special] == -100).all()


def test_masking_statistics_on_a_large_sample() -> None:
    n = 400_000
    ids = torch.randint(5, 1000, (n // 100, 100), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, 1] = 2, 1  # [CLS] and an [UNK] per row: never masked
    masked, targets = mask_tokens(ids, vocab_size=1000, generator=torch.Generator().manual_seed(3))
    sel = targets != -100
    maskable = int((ids >= 5).sum())
    assert abs(int(sel.sum()) / maskable - 0.15) < 0.003
    assert not sel[:, :2].any()
    k = int(sel.sum())
    frac_mask = int((masked[sel] == 4).sum()) / k
    kept = masked[sel] == ids[sel]
    frac_keep = int(kept.sum()) / k
    frac_random = 1 - frac_mask - frac_keep  # a random id equal to the original counts as kept
    assert abs(frac_mask - 0.8) < 0.01
    assert abs(frac_keep - (0.1 + 0.1 / 995)) < 0.01
    assert abs(frac_random - 0.1) < 0.01
    assert int(masked[~sel].ne(ids[~sel]).sum()) == 0  # unselected tokens never change
    assert int(masked[sel].min()) >= 4  # [MASK] or a non-special id: never [PAD]/[UNK]/...


def test_a_batch_without_selection_still_has_targets() -> None:
    ids = torch.tensor([[2, 7, 8, 3], [2, 9, 3, 0]])
    _, targets = mask_tokens(
        ids, vocab_size=20, mask_prob=1e-9, generator=torch.Generator().manual_seed(0)
    )
    expected = torch.tensor([[-100, 7, -100, -100], [-100, 9, -100, -100]])
    torch.testing.assert_close(targets, expected)


def test_windows_have_cls_sep_and_fixed_eval_masks() -> None:
    task = _task()
    assert isinstance(task, Task)
    model = create_model("vanilla-tiny", vocab_size=task.tokenizer.vocab_size, causal=False)
    batch = next(task.train_batches(model))
    d = batch.data
    assert d["input_ids"].shape == (4, 16)
    original = torch.where(d["targets"] != -100, d["targets"], d["input_ids"])
    assert (original[:, 0] == 2).all() and (original[:, -1] == 3).all()
    assert (original[:, 1:-1] >= 5).all()  # subwords only inside
    assert (d["token_type_ids"][:, 0] == 2).all() and (d["token_type_ids"][:, 1:] == 0).all()
    assert (d["attention_mask"] == 1).all()
    # Evaluation windows cover the split in order; the last one is padded and gets its [SEP].
    windows = task.eval_windows_of("valid")
    flat = windows.reshape(-1)
    n = task.splits["valid"].numel()
    torch.testing.assert_close(flat[:n], task.splits["valid"])
    assert (flat[n:] == 0).all()
    last = task.make_batch(windows[-1:], torch.Generator().manual_seed(0))
    real = int(last.data["attention_mask"].sum())
    assert real == 2 + n - (windows.shape[0] - 1) * 14
    ids = torch.where(last.data["targets"] != -100, last.data["targets"], last.data["input_ids"])
    assert ids[0, real - 1] == 3 and (ids[0, real:] == 0).all()


def test_same_seed_same_batches_and_resume() -> None:
    model = create_model("vanilla-tiny", vocab_size=200, causal=False)
    a, b = _task(seed=5), _task(seed=5)
    it_a, it_b = a.train_batches(model), b.train_batches(model)
    first = [next(it_a) for _ in range(3)]
    for batch in first:
        other = next(it_b)
        for k in batch.data:
            torch.testing.assert_close(batch.data[k], other.data[k])
    state = a.state_dict()
    fourth = next(it_a)
    c = _task(seed=5)
    c.load_state_dict(state)
    resumed = next(c.train_batches(model))
    for k in fourth.data:
        torch.testing.assert_close(fourth.data[k], resumed.data[k])
    diff = _task(seed=6)
    assert not torch.equal(
        next(diff.train_batches(model)).data["input_ids"], first[0].data["input_ids"]
    )


def test_corpus_texts_and_read_texts(tmp_path) -> None:
    vocab = Vocab(unit="word", tokens=("<unk>", "<eos>", "a", "b"), unk="<unk>", eos="<eos>")
    ids = torch.tensor([2, 0, 3, 1, 3, 3, 1] * 4)
    corpus = Corpus(
        name="w",
        unit="word",
        vocab=vocab,
        train=ids,
        valid=ids,
        test=ids,
        fingerprint="f",
        source="s",
    )
    assert corpus_texts(corpus, "train")[:2] == ["a [UNK] b", "b b"]
    byte = Corpus(
        name="t",
        unit="byte",
        vocab=Vocab.byte_level(),
        train=torch.tensor(list(b"caf\xc3\xa9 ok\nline two\n")),
        valid=torch.tensor(list(b"x\n")),
        test=torch.tensor(list(b"y\n")),
        fingerprint="f",
        source="s",
    )
    assert corpus_texts(byte, "train") == ["café ok", "line two"]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.txt").write_text("second\n\n")
    (tmp_path / "d" / "a.txt").write_text("first\nfirst again\n")
    (tmp_path / "d" / ".hidden").write_text("no\n")
    assert read_texts(tmp_path / "d") == ["first", "first again", "second"]


def test_mlm_and_electra_train_through_the_trainer() -> None:
    task = _task(eval_windows=4)
    vocab = task.tokenizer.vocab_size
    for model in (
        create_model("vanilla-tiny", vocab_size=vocab, causal=False, seq_len=16),
        create_model("funnel-tiny", vocab_size=vocab, seq_len=16),
    ):
        torch.manual_seed(0)
        hist = train(model, task, TrainConfig(steps=2, warmup=1, eval_every=None, progress=False))
        assert len(hist.losses) == 2 and all(torch.isfinite(torch.tensor(hist.losses)))
        ev = hist.evals[-1]
        assert ev["val_masked_tokens"] > 0 and 0.0 <= ev["val_mlm_accuracy"] <= 1.0
        assert ev["val_mlm_loss"] == ev["val_loss"]
    config = get_config("funnel-tiny", vocab_size=vocab, seq_len=16)
    electra = FunnelElectra(config, replace_config(config, dim=32))
    etask = _task(objective="electra", eval_windows=4)
    hist = train(electra, etask, TrainConfig(steps=2, warmup=1, eval_every=None, progress=False))
    ev = hist.evals[-1]
    assert ev["val_loss"] > ev["val_mlm_loss"] > 0 and 0.0 <= ev["val_disc_accuracy"] <= 1.0
    # Evaluation masks and samples are fixed: evaluating twice gives identical figures.
    assert etask.evaluate(electra, "valid") == etask.evaluate(electra, "valid")
