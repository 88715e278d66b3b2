"""SuperTransformer training through the shared trainer: one SubTransformer per update, drawn
from the update number (so a resumed run draws the same ones), shared by the micro-batches."""

import pytest
import torch

from effiformer import create_model
from effiformer.data import ParallelData
from effiformer.models.hat import TINY_SPACE, sample_generator
from effiformer.tasks.supernet import SuperNetTask, representative_subtransformers
from effiformer.tasks.translation import TranslationTask
from effiformer.train import TrainConfig, train


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


WORDS = {"man": "Mann", "dog": "Hund", "red": "rot", "big": "groß", "runs": "läuft", "a": "ein"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("para")
    keys = list(WORDS)
    for split, n, seed in (("train", 200, 0), ("val", 12, 1), ("test_2016_flickr", 8, 2)):
        g = torch.Generator().manual_seed(seed)
        src, tgt = [], []
        for _ in range(n):
            k = int(torch.randint(2, 6, (1,), generator=g))
            words = [keys[int(i)] for i in torch.randint(0, len(keys), (k,), generator=g)]
            src.append(" ".join(words) + ".")
            tgt.append(" ".join(WORDS[w] for w in words) + ".")
        (d / f"{split}.en").write_text("\n".join(src) + "\n")
        (d / f"{split}.de").write_text("\n".join(tgt) + "\n")
    return d


def _setup(folder, seed=0):
    inner = TranslationTask(
        ParallelData(folder, "en", "de"), vocab_size=100, max_tokens=160, eval_sentences=2
    )
    torch.manual_seed(0)
    model = create_model("hat-tiny", vocab_size=inner.tokenizer.vocab_size, dropout=0.1)
    return SuperNetTask(inner, seed=seed), model


def _record(model):
    seen = []

    def hook(module, args, kwargs):
        if module.training:  # not the final evaluation's forwards
            seen.append(kwargs.get("sample"))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def _config(**kw):
    base = dict(steps=4, lr=3e-3, warmup=1, eval_every=None, progress=False, device="cpu",
                optimizer="adam", betas=(0.9, 0.98), weight_decay=0.0)  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def test_one_subtransformer_per_update_drawn_from_the_update_number(folder):
    task, model = _setup(folder, seed=7)
    seen = _record(model)
    history = train(model, task, _config())
    assert len(history.train) == 4 and all(r["loss"] > 0 for r in history.train)
    assert seen == [TINY_SPACE.sample(sample_generator(7, s)) for s in range(4)]
    assert seen == [task.sample_for(s, model) for s in range(4)]
    assert len({s.trimmed() for s in seen}) > 1


def test_micro_batches_share_the_update_sample(folder):
    task, model = _setup(folder)
    batch = next(task.train_batches(model))
    rows = batch.rows - batch.rows % 2
    even = type(batch)({k: v[:rows] for k, v in batch.data.items()}, batch.new_stream, batch.meta)
    parts = even.split(2)
    assert all(p.meta["sample"] is batch.meta["sample"] for p in parts)
    seen = _record(model)
    for p in parts:
        task.forward(model, p, None).loss.backward()
    assert seen == [batch.meta["sample"]] * 2


def test_resume_draws_the_same_subtransformers_and_losses(folder, tmp_path):
    task, model = _setup(folder)
    cfg = _config(out_dir=str(tmp_path / "a"), checkpoint_every=2, keep_checkpoints=None)
    full = train(model, task, cfg)
    task, model = _setup(folder)
    seen = _record(model)
    half = str(tmp_path / "a" / "step-00000002")
    resumed = train(model, task, _config(out_dir=str(tmp_path / "b"), resume=half))
    assert seen == [TINY_SPACE.sample(sample_generator(0, s)) for s in (2, 3)]
    assert [r["loss"] for r in resumed.train] == [r["loss"] for r in full.train[2:]]
    task, model = _setup(folder, seed=1)
    with pytest.raises(Exception, match="seed"):
        train(model, task, _config(out_dir=str(tmp_path / "c"), resume=half))


def test_evaluation_scores_the_largest_and_the_smallest(folder):
    task, model = _setup(folder)
    task.inner.eval_sentences = 4
    reps = representative_subtransformers(TINY_SPACE)
    assert reps["largest"].attend == (2, 2) and reps["smallest"].decoder_layers == 1
    r = task.evaluate(model, "valid")
    assert {"bleu", "loss", "largest_loss", "smallest_loss", "smallest_bleu"} <= set(r)
    assert r["loss"] == r["largest_loss"] != r["smallest_loss"]
    assert task.describe()["supernet"]["seed"] == 0
