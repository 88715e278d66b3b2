"""The GLUE classification/regression task through the trainer: fine-tuning from a pretrained
model, checkpoint and reload of the classifier, exact resume of the data position."""

from __future__ import annotations

from pathlib import Path

from effiformer.data.glue import GLUE_TASKS, read_glue


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


# ---- the task through the trainer ---------------------------------------------------------


def _tiny_glue(tmp_path: Path) -> tuple[Path, Path]:
    words = ["good", "bad", "fine", "awful", "great", "poor", "film", "plot", "the", "a"]
    sst_rows = [f"the {words[i % 6]} {words[6 + i % 2]}\t{int(i % 2 == 0)}" for i in range(24)]
    sst = tmp_path / "SST-2"
    _write(sst, "train.tsv", "sentence\tlabel\n" + "\n".join(sst_rows) + "\n")
    _write(sst, "dev.tsv", "sentence\tlabel\n" + "\n".join(sst_rows[:10]) + "\n")
    sts_rows = [
        f"{i}\tg\tf\t2012\t0\tn\tn\ta {words[i % 6]} film\tthe plot\t{i % 6}.0" for i in range(16)
    ]
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    sts = tmp_path / "STS-B"
    _write(sts, "train.tsv", header + "\n".join(sts_rows) + "\n")
    _write(sts, "dev.tsv", header + "\n".join(sts_rows[:8]) + "\n")
    return sst, sts


def test_fine_tune_step_checkpoint_and_reload(tmp_path: Path) -> None:
    import torch

    from effiformer import create_model
    from effiformer.data.tokenizer import SubwordTokenizer
    from effiformer.models.classifier import SequenceClassifier
    from effiformer.models.funnel import FunnelForSequenceClassification
    from effiformer.tasks import Task
    from effiformer.tasks.glue import GlueTask, load_classifier
    from effiformer.train import TrainConfig, train

    sst, sts = _tiny_glue(tmp_path)
    texts = [ex.text_a for ex in read_glue("sst2", sst)] + ["a the plot film"] * 4
    tok = SubwordTokenizer.train(texts, vocab_size=60, min_frequency=1)
    runs = [(sst, "sst2", 2, ("funnel-tiny", "vanilla-tiny")), (sts, "stsb", 1, ("funnel-tiny",))]
    for folder, name, n_out, bases in runs:
        task = GlueTask(name, folder, tok, batch_size=4, max_len=16, eval_batch_size=5)
        assert isinstance(task, Task) and task.metric_name == GLUE_TASKS[name].metrics[0]
        batch = task.encode(task.examples("train")[:4])
        assert batch.data["labels"].dtype == (torch.int64 if n_out == 2 else torch.float32)
        assert (batch.data["input_ids"][:, 0] == tok.cls_id).all()
        for base in bases:
            kw = {"causal": False} if base.startswith("vanilla") else {}
            pretrained = create_model(base, vocab_size=tok.vocab_size, seq_len=16, **kw)
            clf = pretrained.sequence_classifier(n_out)
            if base.startswith("funnel"):
                assert isinstance(clf, FunnelForSequenceClassification)
                enc = pretrained.funnel.encoder.state_dict()
                for k, v in clf.funnel.encoder.state_dict().items():
                    torch.testing.assert_close(v, enc[k])
            else:
                assert isinstance(clf, SequenceClassifier) and clf.encoder is pretrained
            out = tmp_path / f"run-{name}-{base}"
            cfg = TrainConfig(steps=2, warmup=1, lr=1e-3, progress=False, out_dir=str(out))
            hist = train(clf, task, cfg)
            assert len(hist.losses) == 2
            assert list(hist.evals[-1]) == [
                "step",
                *(f"val_{m}" for m in GLUE_TASKS[name].metrics),
                "val_loss",
                "val_examples",
            ]
            back, meta = load_classifier(out)
            assert meta["task"]["task"] == f"glue-{name}" and (out / "latest").is_file()
            assert task.evaluate(back) == task.evaluate(clf)
            # The data position resumes exactly: the next batch after a reload is the same.
            state = task.state_dict()
            nxt = next(task.train_batches(clf))
            again = GlueTask(name, folder, tok, batch_size=4, max_len=16)
            again.load_state_dict(state)
            torch.testing.assert_close(
                next(again.train_batches(clf)).data["input_ids"], nxt.data["input_ids"]
            )


def test_dense_classifier_skips_the_mlm_head_and_keeps_the_hidden_state() -> None:
    import torch

    from effiformer import create_model
    from effiformer.models.classifier import SequenceClassifier

    torch.manual_seed(0)
    enc = create_model("vanilla-tiny", causal=False, vocab_size=50, seq_len=12, dropout=0.0).eval()
    ids = torch.randint(0, 50, (3, 12))
    keep = torch.ones(3, 12, dtype=torch.bool)
    keep[1, 8:] = False
    full = enc(ids, attention_mask=keep).hidden  # runs the tied head too
    clf = SequenceClassifier(enc, 2).eval()

    def _no_head(h):
        raise AssertionError("the MLM head ran inside the classifier")

    enc.head.forward = _no_head
    out = clf(ids, attention_mask=keep, labels=torch.tensor([0, 1, 1]))
    torch.testing.assert_close(out.hidden, full, rtol=0, atol=0)
    torch.testing.assert_close(out.logits, clf.head(full))
    assert torch.isfinite(out.loss)


def test_pretraining_runs_rebuild_their_model_and_become_classifiers(tmp_path: Path) -> None:
    """GLUE's --init: the pretraining task rebuilds its model (ELECTRA: generator +
    discriminator, from the options recorded in the run); the model makes the classifier."""
    import torch

    from effiformer.cli import main
    from effiformer.models.funnel import FunnelElectra, FunnelForSequenceClassification
    from effiformer.tasks.glue import load_pretrained

    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"the {w} film was {w} and the plot" for w in "abcdefgh" * 40))
    run = tmp_path / "electra"
    assert main(["train", "funnel-tiny", "--task", "electra", "--text", str(text),
                 "--vocab-size", "60", "--generator-scale", "2", "--steps", "1", "--batch", "2",
                 "--seq-len", "16", "--eval-windows", "2", "--no-progress", "--device", "cpu",
                 "--out", str(run)]) == 0  # fmt: skip
    model = load_pretrained(run)
    assert isinstance(model, FunnelElectra) and model.generator.config.dim == 32  # dim 64 / 2
    clf = model.sequence_classifier(3)
    assert isinstance(clf, FunnelForSequenceClassification) and clf.n_labels == 3
    enc = model.discriminator.encoder.state_dict()
    for k, v in clf.funnel.encoder.state_dict().items():
        torch.testing.assert_close(v, enc[k], rtol=0, atol=0)
