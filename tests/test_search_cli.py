"""`effiformer search latency-data | predictor | evolve` end to end at tiny sizes (HAT on a
trained tiny SuperTransformer, and a registered family); nothing is timed or compared here."""

import io
import json

import pytest
import torch
from torch.testing import assert_close

from effiformer import load_model
from effiformer.cli import main
from effiformer.models.hat import SubTransformer


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _folder(d):
    words = {"man": "Mann", "dog": "Hund", "red": "rot", "big": "groß", "a": "ein"}
    keys = list(words)
    for split, n, seed in (("train", 120, 0), ("val", 10, 1)):
        g = torch.Generator().manual_seed(seed)
        src, tgt = [], []
        for _ in range(n):
            w = [keys[int(i)] for i in torch.randint(0, len(keys), (3,), generator=g)]
            src.append(" ".join(w) + ".")
            tgt.append(" ".join(words[x] for x in w) + ".")
        (d / f"{split}.en").write_text("\n".join(src) + "\n")
        (d / f"{split}.de").write_text("\n".join(tgt) + "\n")
    return d


def _json(capsys):
    """The last JSON record printed (``predictor`` follows its record with a human line)."""
    lines = capsys.readouterr().out.strip().splitlines()
    return json.loads(next(x for x in reversed(lines) if x.startswith("{")))


def test_hat_end_to_end_from_the_command_line(tmp_path, capsys, monkeypatch):
    """Issue 28 item 3: the SuperTransformer trains with ``effiformer train`` (one sampled
    SubTransformer per update), the search runs on that run, and the exported SubTransformer is
    a run that ``eval`` scores and ``translate`` decodes with; the SuperTransformer run itself is
    refused by ``translate`` with what to do instead."""
    data = _folder(tmp_path)
    assert main(["train", "hat-tiny", "--task", "translation", "--data", str(data), "--src",
                 "en", "--tgt", "de", "--vocab-size", "80", "--max-tokens", "120",
                 "--eval-sentences", "2", "--steps", "3", "--lr", "3e-3", "--warmup", "1",
                 "--eval-every", "0", "--out", str(tmp_path / "super")]) == 0  # fmt: skip
    trained = _json(capsys)
    assert trained["step"] == 3 and "val_smallest_loss" in trained  # both representatives

    lat, pred = str(tmp_path / "lat.csv"), str(tmp_path / "pred.pt")
    assert main(["search", "latency-data", "--space", "tiny", "--n", "12", "--runs", "1",
                 "--warmup", "0", "--vocab-size", "64", "--src-len", "6", "--out", lat]) == 0  # fmt: skip
    assert _json(capsys)["rows"] == 12
    assert main(["search", "predictor", lat, "--steps", "30", "--lr", "1e-3", "--out", pred,
                 "--plot", str(tmp_path / "p.png")]) == 0  # fmt: skip
    out_lines = capsys.readouterr().out.strip().splitlines()
    rec = json.loads(out_lines[-2])
    assert out_lines[-1].startswith("test RMSE (MAPE), best first: ") and "mlp " in out_lines[-1]
    assert set(rec["test"]) == {"mlp", "features_linear", "macs_linear", "decoding_macs_linear",
                                "features_macs_linear", "features_decoding_macs_linear"}  # fmt: skip
    assert (tmp_path / "p.png").is_file()
    out = tmp_path / "evo.json"
    args = ["search", "evolve", str(tmp_path / "super"), "--predictor", pred, "--latency-ms",
            "1e6", "--population", "6", "--parents", "2", "--mutations", "2", "--crossovers",
            "2", "--iterations", "2", "--sentences", "6", "--out", str(out), "--plot",
            str(tmp_path / "evo.png"), "--export", str(tmp_path / "sub")]  # fmt: skip
    assert main(args) == 0
    summary = _json(capsys)
    full = json.loads(out.read_text())
    assert summary["best_predicted_ms"] <= 1e6 and len(full["evaluated"]) >= 6
    best = SubTransformer.from_dict(full["best"])
    exported = load_model(tmp_path / "sub").eval()
    assert exported.config.sub == best
    sup = load_model(tmp_path / "super" / "step-00000003").eval()
    x = torch.tensor([[5, 6, 7, 3]])
    assert_close(exported(x, x).logits, sup(x, x, sample=best).logits)
    assert (tmp_path / "sub" / "step-00000003" / "tokenizer.json").is_file()
    assert main(["eval", str(tmp_path / "sub"), "--eval-sentences", "3"]) == 0
    scored = json.loads(capsys.readouterr().out.splitlines()[0])
    assert scored["sentences"] == 3 and scored["model"] == "hat-subtransformer"
    assert 0 <= scored["bleu"] <= 100
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a red dog.\nbig man.\n")))
    assert main(["translate", str(tmp_path / "sub"), "--no-progress"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["translate", str(tmp_path / "super"), "--no-progress"]) != 0
    assert "holds a SuperTransformer (HAT)" in capsys.readouterr().err
    # an infeasible limit is a clear error, exit code 2
    i = args.index("--latency-ms") + 1
    assert main([*args[:i], "0.0001", *args[i + 1 :], "--max-tries", "50"]) == 2
    assert "no candidate with a predicted latency <= 0.0001 ms" in capsys.readouterr().err


def test_family_search_steps(tmp_path, capsys):
    lat, pred = str(tmp_path / "fam.csv"), str(tmp_path / "fam.pt")
    assert main(["search", "latency-data", "--model", "vanilla-tiny", "--set", "attention=local",
                 "seq_len=64", "--choices", "attention.window=16,32", "n_layers=1,2",
                 "--seq-len", "64", "--n", "10", "--runs", "1", "--warmup", "0", "--out",
                 lat]) == 0  # fmt: skip
    assert _json(capsys)["kind"] == "family"
    assert main(["search", "predictor", lat, "--steps", "20", "--lr", "1e-3", "--out", pred]) == 0
    assert set(_json(capsys)["test"]) == {"mlp", "features_linear"}
    assert main(["search", "evolve", "--family-data", lat, "--predictor", pred, "--latency-ms",
                 "1e6", "--population", "4", "--parents", "2", "--mutations", "1",
                 "--crossovers", "1", "--iterations", "2"]) == 0  # fmt: skip
    rec = _json(capsys)
    assert rec["model"] == "vanilla-tiny" and set(rec["best"]) == {"attention.window", "n_layers"}
    assert rec["best"]["n_layers"] == 2  # the most parameters under an unlimited latency


def test_latency_data_refuses_fewer_rows_than_the_predictor_splits(tmp_path, capsys):
    """Issue 28: ``latency-data --n 8`` used to measure 8 rows and only then have ``predictor``
    refuse them; now the first step says it, one line, nothing written."""
    out = tmp_path / "lat.csv"
    with pytest.raises(SystemExit) as e:
        main(["search", "latency-data", "--out", str(out), "--n", "8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "the predictor step needs at least 10 rows" in err and "got 8" in err
    assert len(err.splitlines()) == 1
    assert not out.exists()
