"""The duplication task (0w0w): batch format and scoring on the copied half, deterministic from the
seed with exact resume through the trainer, accuracy of a copying oracle and of chance, and
evaluation of one trained model with several hash counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from effiformer import create_model
from effiformer.config import ModelConfig
from effiformer.models.base import IGNORE_INDEX, EffiModel, ModelOutput, lm_loss
from effiformer.tasks import Batch, Task
from effiformer.tasks.duplication import DuplicationTask, evaluate_with_hashes
from effiformer.train import TrainConfig, train


def test_sequences_are_0w0w_and_only_the_copy_is_scored():
    task = DuplicationTask(seq_len=12, vocab_size=10, batch_size=4, seed=3)
    assert isinstance(task, Task)
    x, y = task.batch(0)
    assert x.shape == y.shape == (4, 11)
    seq = torch.cat([x, y[:, -1:]], 1)  # the full sequence
    w = seq[:, 1:6]
    assert (seq[:, 0] == 0).all() and (seq[:, 6] == 0).all()
    assert torch.equal(seq[:, 7:], w) and (w >= 1).all() and (w < 10).all()
    assert (y[:, :6] == IGNORE_INDEX).all()
    assert torch.equal(y[:, 6:], w)  # the 5 copied tokens, predicted from position 6 on


def test_data_is_a_function_of_the_seed_and_resumes_exactly():
    task = DuplicationTask(seq_len=16, vocab_size=8, batch_size=4, seed=1)
    model = create_model("vanilla-tiny", seq_len=16, n_layers=1)
    it = task.train_batches(model)
    first = [next(it).data["input_ids"] for _ in range(3)]
    state = task.state_dict()
    nxt = next(it).data["input_ids"]
    other = DuplicationTask(seq_len=16, vocab_size=8, batch_size=4, seed=1)
    other.load_state_dict(state)
    assert torch.equal(next(other.train_batches(model)).data["input_ids"], nxt)
    assert not torch.equal(first[0], first[1])
    # two ranks see the rows of the same global batch
    a = DuplicationTask(seq_len=16, vocab_size=8, batch_size=4, seed=1)
    r0 = next(a.train_batches(model, 0, 2)).data["input_ids"]
    b = DuplicationTask(seq_len=16, vocab_size=8, batch_size=4, seed=1)
    r1 = next(b.train_batches(model, 1, 2)).data["input_ids"]
    assert torch.equal(torch.cat([r0, r1]), first[0])
    with pytest.raises(ValueError, match="same task settings"):
        DuplicationTask(seq_len=16, vocab_size=8, batch_size=4, seed=2).load_state_dict(state)


def test_training_resumes_bitwise_through_the_trainer(tmp_path):
    def model():
        torch.manual_seed(0)
        return create_model(
            "vanilla-tiny", seq_len=32, n_layers=1, vocab_size=8, dropout=0.1,
            attention={"name": "lsh", "chunk_len": 8, "n_hashes": 1},
        )  # fmt: skip

    def task():
        return DuplicationTask(seq_len=32, vocab_size=8, batch_size=4, eval_sequences=8)

    def cfg(**kw):
        return TrainConfig(
            steps=4, lr=1e-3, warmup=1, eval_every=None, device="cpu", progress=False, **kw
        )

    full = train(model(), task(), cfg(out_dir=str(tmp_path / "a")))
    # a run killed during step 3, after its step-2 checkpoint
    dying = task()
    forward, calls = dying.forward, {"n": 0}

    def dying_forward(m, *args, **kwargs):
        calls["n"] += m.training
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return forward(m, *args, **kwargs)

    dying.forward = dying_forward
    with pytest.raises(KeyboardInterrupt):
        train(model(), dying, cfg(out_dir=str(tmp_path / "b"), checkpoint_every=2))
    torch.manual_seed(99)
    resumed = train(model(), task(), cfg(out_dir=str(tmp_path / "b"), resume=str(tmp_path / "b")))
    assert resumed.start_step == 2
    a = [r["loss"] for r in full.train if r["step"] > 2]
    b = [r["loss"] for r in resumed.train]
    assert a == b


class _Copier(EffiModel):
    """Predicts the token half a sequence back (a perfect copier), or uniform logits."""

    def __init__(self, vocab_size: int, seq_len: int, perfect: bool = True):
        super().__init__()
        self.config = ModelConfig(vocab_size=vocab_size, dim=4, n_heads=1, seq_len=seq_len)
        self.perfect = perfect
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, *, targets=None):
        b, t = input_ids.shape
        half = (t + 1) // 2
        logits = torch.zeros(b, t, self.config.vocab_size) + self.dummy
        if self.perfect:
            # position p >= half predicts seq[p + 1] = seq[p + 1 - half] = input_ids[p + 1 - half]
            src = input_ids[:, 1 : t - half + 1]  # (B, t - half)
            logits[:, half:] += 10 * nn.functional.one_hot(src, self.config.vocab_size)
        return ModelOutput(logits=logits, loss=lm_loss(logits, targets))


def test_accuracy_of_a_copier_and_of_chance():
    task = DuplicationTask(seq_len=20, vocab_size=11, eval_sequences=32, eval_batch_size=8)
    good = task.evaluate(_Copier(11, 19), "valid")
    assert good["accuracy"] == 1.0 and good["sequence_accuracy"] == 1.0
    assert good["tokens"] == 32 * 9 and good["sequences"] == 32
    flat = task.evaluate(_Copier(11, 19, perfect=False), "valid")
    assert flat["loss"] == pytest.approx(torch.log(torch.tensor(11.0)).item(), rel=1e-6)
    assert task.split("valid")[0].shape == (32, 19)
    assert not torch.equal(task.split("valid")[0], task.split("test")[0])


def test_one_trained_model_is_evaluated_with_several_hash_counts():
    torch.manual_seed(0)
    model = create_model(
        "reformer-tiny", seq_len=64, vocab_size=16, loss_chunk=None,
        attention={"name": "lsh", "chunk_len": 8, "n_hashes": 1},
    )  # fmt: skip
    task = DuplicationTask(seq_len=64, vocab_size=16, eval_sequences=8, eval_batch_size=4)
    res = evaluate_with_hashes(model, task, (1, 2, 4, 8), split="valid")
    assert sorted(res) == [1, 2, 4, 8]
    assert res[1] != res[8]  # other hashes: other attention
    assert evaluate_with_hashes(model, task, (2,), split="valid")[2] == res[2]  # reproducible
    assert model.blocks[0].attn.config.n_hashes == 1  # the trained model is untouched


def test_refuses_bad_settings_and_models():
    with pytest.raises(ValueError, match="even"):
        DuplicationTask(seq_len=11)
    task = DuplicationTask(seq_len=64, vocab_size=300)
    with pytest.raises(ValueError, match="vocab_size"):
        next(task.train_batches(create_model("vanilla-tiny")))
    with pytest.raises(ValueError, match="split"):
        task.split("dev")
    assert task.describe()["task"] == "duplication" and task.artifacts() == {}
    assert isinstance(Batch({"input_ids": task.batch(0)[0]}).rows, int)
