"""LMTask: rank sharding of global batches, stream vs window batching, exact data resume, and
bpc / perplexity against a by-hand float64 computation."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from effiformer import create_model
from effiformer.config import ModelConfig
from effiformer.data import eval_batches, read_ptb, read_text
from effiformer.models.base import EffiModel, ModelOutput, lm_loss
from effiformer.tasks import Batch, LMTask, Task


def _text(n_words: int = 3000, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]
    lines = [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(n_words // 7)
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def byte_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("lmtask") / "tiny.txt"
    path.write_text(_text(4000))
    return read_text(path)


@pytest.fixture(scope="module")
def word_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("ptb")
    for i, split in enumerate(("train", "valid", "test")):
        (d / f"ptb.{split}.txt").write_text(_text(2000 if split == "train" else 600, seed=i))
    return read_ptb(d)


class _MemLM(EffiModel):
    """A stateful toy LM: every position sees the last hidden state of the previous segment."""

    def __init__(self, vocab_size: int = 256, dim: int = 16, seq_len: int = 64):
        super().__init__()
        self.config = ModelConfig(vocab_size=vocab_size, dim=dim, n_heads=1, seq_len=seq_len)
        self.embed = nn.Embedding(vocab_size, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab_size)

    def init_state(self, batch_size, device=None):
        return torch.zeros(batch_size, self.config.dim, device=device)

    def forward(self, input_ids, *, targets=None, state=None):
        self.check_input_ids(input_ids)
        h = self.embed(input_ids) + self.mix(state)[:, None, :]  # (B, T, D)
        h = torch.tanh(torch.cumsum(h, dim=1) / torch.arange(1, h.shape[1] + 1)[:, None])
        logits = self.head(h)  # (B, T, V)
        loss = None if targets is None else lm_loss(logits, targets)
        return ModelOutput(logits=logits, loss=loss, hidden=h, state=h[:, -1].detach())


def test_lm_task_implements_task_protocol(byte_corpus):
    task = LMTask(byte_corpus, batch_size=4, seq_len=16)
    assert isinstance(task, Task)
    assert task.metric_name == "bpc"
    assert task.artifacts()["vocab.json"] == byte_corpus.vocab.to_json().encode()


def test_ranks_take_equal_row_blocks_of_the_same_global_batch(byte_corpus):
    model = create_model("vanilla-tiny")
    full = LMTask(byte_corpus, batch_size=4, seq_len=16, seed=3).train_batches(model, 0, 1)
    shards = [
        LMTask(byte_corpus, batch_size=4, seq_len=16, seed=3).train_batches(model, r, 2)
        for r in range(2)
    ]
    for _ in range(3):
        want = next(full)
        parts = [next(s) for s in shards]
        for key in ("input_ids", "targets"):
            got = torch.cat([p.data[key] for p in parts])
            torch.testing.assert_close(got, want.data[key], rtol=0, atol=0)
        torch.testing.assert_close(want.data["targets"][:, :-1], want.data["input_ids"][:, 1:])


def test_stateless_models_get_shuffled_windows_stateful_get_contiguous_streams(byte_corpus):
    task = LMTask(byte_corpus, batch_size=2, seq_len=16, seed=0)
    first, second = task.train_batches(create_model("vanilla-tiny"), 0, 1), None
    a, b = next(first), next(first)
    assert task.state_dict()["batcher"] == "window"
    # Shuffled windows: row 0 of the next batch does not continue row 0 of this one.
    assert not torch.equal(b.data["input_ids"][:, 0], a.data["targets"][:, -1])

    task = LMTask(byte_corpus, batch_size=2, seq_len=16)
    second = task.train_batches(_MemLM(), 0, 1)
    a, b = next(second), next(second)
    assert task.state_dict()["batcher"] == "stream"
    assert a.new_stream and not b.new_stream
    torch.testing.assert_close(b.data["input_ids"][:, 0], a.data["targets"][:, -1])


def test_data_position_resumes_exactly_and_refuses_other_data(byte_corpus, word_corpus):
    model = create_model("vanilla-tiny")
    task = LMTask(byte_corpus, batch_size=4, seq_len=16, seed=1)
    it = task.train_batches(model, 0, 1)
    for _ in range(5):
        next(it)
    saved = task.state_dict()
    want = [next(it).data["input_ids"] for _ in range(3)]
    fresh = LMTask(byte_corpus, batch_size=4, seq_len=16, seed=1)
    fresh.load_state_dict(saved)
    it2 = fresh.train_batches(model, 0, 1)
    got = [next(it2).data["input_ids"] for _ in range(3)]
    torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=0, atol=0)

    other = LMTask(word_corpus, batch_size=4, seq_len=16)
    with pytest.raises(ValueError, match="fingerprint"):
        other.load_state_dict(saved)
    wrong_batch = LMTask(byte_corpus, batch_size=2, seq_len=16, seed=1)
    wrong_batch.load_state_dict(saved)
    with pytest.raises(ValueError, match="batch_size"):
        wrong_batch.train_batches(model, 0, 1)


def _by_hand_nats(model, data, rows, seq_len, stateful):
    total, count = torch.zeros((), dtype=torch.float64), 0
    state = model.init_state(rows) if stateful else None
    for x, y in eval_batches(data, rows, seq_len):
        out = model(x, state=state) if stateful else model(x)
        state = out.state
        logp = F.log_softmax(out.logits.double(), dim=-1)  # (B, T, V)
        total -= logp.gather(-1, y[..., None]).sum()
        count += y.numel()
    return float(total) / count, count


@torch.no_grad()
def test_bpc_is_nats_over_ln2_of_the_whole_split(byte_corpus):
    torch.manual_seed(0)
    model = create_model("vanilla-tiny").eval()
    task = LMTask(byte_corpus, batch_size=2, seq_len=32, eval_batch_size=4)
    result = task.evaluate(model, "valid")
    nats, count = _by_hand_nats(model, byte_corpus.valid, 4, 32, stateful=False)
    assert result["tokens"] == count == 4 * (byte_corpus.valid.numel() // 4 - 1)
    torch.testing.assert_close(
        torch.tensor([result["loss"], result["bpc"]], dtype=torch.float64),
        torch.tensor([nats, nats / math.log(2)], dtype=torch.float64),
        rtol=1e-6,
        atol=0,
    )
    capped = LMTask(byte_corpus, batch_size=2, seq_len=32, eval_batch_size=4, eval_tokens=200)
    assert capped.evaluate(model, "valid")["tokens"] <= 200


@torch.no_grad()
def test_perplexity_for_word_corpora(word_corpus):
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", vocab_size=word_corpus.vocab.size).eval()
    task = LMTask(word_corpus, batch_size=2, seq_len=16, eval_batch_size=2)
    assert task.metric_name == "ppl"
    result = task.evaluate(model, "test")
    nats, _ = _by_hand_nats(model, word_corpus.test, 2, 16, stateful=False)
    torch.testing.assert_close(
        torch.tensor([result["ppl"]], dtype=torch.float64),
        torch.tensor([math.exp(nats)], dtype=torch.float64),
        rtol=1e-6,
        atol=0,
    )


@torch.no_grad()
def test_evaluation_carries_recurrent_state(byte_corpus):
    torch.manual_seed(0)
    model = _MemLM(seq_len=32).eval()
    task = LMTask(byte_corpus, batch_size=2, seq_len=32, eval_batch_size=3)
    result = task.evaluate(model, "valid")
    with_state, _ = _by_hand_nats(model, byte_corpus.valid, 3, 32, stateful=True)
    torch.testing.assert_close(result["loss"], with_state, rtol=1e-6, atol=0)

    class _Reset(_MemLM):  # the same model with its memory wiped every call
        def forward(self, input_ids, *, targets=None, state=None):
            return super().forward(input_ids, targets=targets, state=torch.zeros_like(state))

    reset = _Reset(seq_len=32).eval()
    reset.load_state_dict(model.state_dict())
    assert abs(task.evaluate(reset, "valid")["loss"] - result["loss"]) > 1e-4


def test_bad_task_arguments(byte_corpus):
    model = create_model("vanilla-tiny")
    with pytest.raises(TypeError, match="Corpus"):
        LMTask("not a corpus")
    with pytest.raises(ValueError, match="batch_size"):
        LMTask(byte_corpus, batch_size=0)
    with pytest.raises(ValueError, match="divisible"):
        LMTask(byte_corpus, batch_size=3, seq_len=16).train_batches(model, 0, 2)
    with pytest.raises(ValueError, match="exceeds the model's seq_len"):
        LMTask(byte_corpus, batch_size=2, seq_len=4096).train_batches(model, 0, 1)
    with pytest.raises(ValueError, match="vocab_size"):
        LMTask(byte_corpus, batch_size=2, seq_len=16).train_batches(
            create_model("vanilla-tiny", vocab_size=100), 0, 1
        )
    with pytest.raises(ValueError, match="input_ids"):
        Batch({"targets": torch.zeros(2, 3, dtype=torch.long)})


def test_non_causal_models_are_refused_naming_the_masked_lm_task(byte_corpus):
    task = LMTask(byte_corpus, batch_size=2, seq_len=16)
    for model in (create_model("funnel-tiny"), create_model("vanilla-tiny", causal=False)):
        with pytest.raises(ValueError, match=r"bidirectional encoder \(causal=False\).*--task mlm"):
            task.check_model(model)
        with pytest.raises(ValueError, match="bidirectional encoder"):
            next(task.train_batches(model))
    with pytest.raises(ValueError, match="^funnel-tiny is a bidirectional encoder"):
        task.check_model(create_model("funnel-tiny"), name="funnel-tiny")
    task.check_model(create_model("vanilla-tiny"))  # causal: fine


def test_cli_lm_refuses_a_bidirectional_model_in_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "effiformer", "train", "funnel-tiny", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "effiformer train: error: funnel-tiny is a bidirectional encoder (causal=False): "
        "next-token prediction would see the target; train it with --task mlm"
    ]
    assert not (tmp_path / "x").exists()


def test_eval_overrides_evaluate_the_reconfigured_model(byte_corpus):
    from effiformer.models.transformer_xl import reconfigure

    torch.manual_seed(0)
    model = create_model("xl-tiny", mem_len=8)
    kw = dict(batch_size=2, seq_len=16, eval_batch_size=2, eval_tokens=300)
    plain = LMTask(byte_corpus, **kw).evaluate(model)
    over = {"mem_len": 32, "clamp_len": 4, "same_length": True}
    longer = LMTask(byte_corpus, eval_overrides=over, **kw).evaluate(model)
    assert longer == LMTask(byte_corpus, **kw).evaluate(reconfigure(model, **over))
    assert longer["bpc"] != plain["bpc"] and longer["tokens"] == plain["tokens"]
    assert model.config.mem_len == 8  # the trained model itself is untouched
    with pytest.raises(ValueError, match="only runtime fields"):
        LMTask(byte_corpus, eval_overrides={"n_layers": 1}, **kw)
