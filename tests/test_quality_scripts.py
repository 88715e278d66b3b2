"""benchmarks/mqar_by_length.py: a recorded MQAR cell scored again at the lengths of its ladder
from its checkpoint (tiny sizes, fixed steps: nothing here is timed)."""

import json

import torch

from effiformer.bench.quality import run_quality


def test_mqar_by_length_scores_a_smoke_cell_at_each_ladder_length(tmp_path, bench_script):
    script = bench_script("mqar_by_length")
    out = tmp_path / "q"
    threads = torch.get_num_threads()
    try:
        recs = run_quality(["mqar", "duplication"], ["dense"], budget="smoke", out=out,
                           progress=False)  # fmt: skip
        mqar = next(r for r in recs if r["task"] == "mqar")
        dup = next(r for r in recs if r["task"] == "duplication")
        argv = ["--out", str(out), "--min-len", "16", "--cells"]
        # refusals: one line, exit 2, nothing written
        assert script.main([*argv, "mqar/dense/T64/lr0.1/s0"]) == 2
        assert script.main([*argv, mqar["cell"], dup["cell"]]) == 2  # not an MQAR cell
        assert script.main(["--out", str(out), "--min-len", "48", "--cells", mqar["cell"]]) == 2
        assert not (out / "by_length.jsonl").exists()
        assert script.main([*argv, mqar["cell"]]) == 0
        # a second cell's row is added; the first one's stays
        with open(out / "by_length.jsonl", "a") as f:
            f.write(json.dumps({"cell": "other", "mechanism": "x", "test": {"16": 0.5}}) + "\n")
        assert script.main([*argv, mqar["cell"]]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (out / "by_length.jsonl").read_text().splitlines()]
    assert [r["cell"] for r in rows] == [mqar["cell"], "other"]
    acc = rows[0]["test"]
    assert list(acc) == ["16", "32", "64"] and all(0.0 <= v <= 1.0 for v in acc.values())
    assert acc["64"] == mqar["test"]  # at its own length: the suite's own test set
    assert len(set(acc.values())) > 1  # other lengths are other test sets
    md = (out / "by_length.md").read_text()
    assert "| T=16 | T=32 | T=64 |" in md and f"{100 * mqar['test']:.1f}%" in md


def test_relative_xl_position_share_is_zero_only_for_the_zero_started_ablation(
    tmp_path, bench_script
):
    script = bench_script("relative_xl_position_share")
    threads = torch.get_num_threads()
    argv = ["--budget", "smoke", "--length", "64"]
    q = tmp_path / "q"
    try:
        (rec,) = run_quality(["mqar"], ["relative-xl"], budget="smoke", out=q, progress=False)
        assert script.main(["--out", str(tmp_path / "no"), *argv, "--mechanisms", "dense"]) == 2
        assert script.main(["--out", str(tmp_path / "no"), *argv, "--trained", f"{q}:nothing"]) == 2
        assert not (tmp_path / "no").exists()  # refused before anything is written
        trained = ["--trained", f"{q}:{rec['cell']}"]
        assert script.main(["--out", str(tmp_path / "ps"), *argv, *trained]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [
        json.loads(x) for x in (tmp_path / "ps" / "position_share.jsonl").read_text().splitlines()
    ]
    (after,) = [r for r in rows if r["weights"] != "init"]
    assert after["cell"] == rec["cell"] and after["weights"].startswith("trained (step-")
    by = {r["mechanism"]: r for r in rows if r["weights"] == "init"}
    assert set(by) == {"relative-xl", "relative-xl-r0"}
    assert after["share"] != by["relative-xl"]["share"]  # trained weights, another sequence
    assert 0.1 < by["relative-xl"]["share"] < 0.9 and by["relative-xl"]["content_var"] > 0
    assert by["relative-xl-r0"]["share"] == 0.0 and by["relative-xl-r0"]["content_var"] > 0
    assert (
        "| relative-xl-r0 | 64 | init | 0 |" in (tmp_path / "ps" / "position_share.md").read_text()
    )


def test_relative_xl_position_profile_is_centred_and_zero_for_the_zero_started_ablation(
    tmp_path, bench_script
):
    script = bench_script("relative_xl_position_share")
    threads = torch.get_num_threads()
    try:
        assert script.main(["--out", str(tmp_path), "--budget", "smoke", "--length", "64"]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (tmp_path / "position_share.jsonl").read_text().splitlines()]
    t = 64
    for r in rows:
        prof = r["profile"]
        assert list(prof) == ["0-0", "1-1", "2-8", "9-64"]  # the bands that lie within T
        # the bands partition the causal pairs (T - d of them at distance d), so their means,
        # weighted by their pair counts, sum to zero about the mean over all pairs
        counts = {k: sum(t - d for d in range(int(k.split("-")[0]), min(int(k.split("-")[1]), t - 1) + 1))
                  for k in prof}  # fmt: skip
        for h in range(len(prof["0-0"])):
            total = sum(counts[k] * prof[k][h] for k in prof)
            assert abs(total) < 1e-3 * sum(counts.values())
        if r["mechanism"] == "relative-xl-r0":
            assert all(v == 0.0 for band in prof.values() for v in band)
        else:
            assert max(abs(v) for band in prof.values() for v in band) > 0.01
    md = (tmp_path / "position_share.md").read_text()
    assert "| row | T | weights | layer | 0 | 1 | 2-8 | 9-64 | 65-256 |" in md


def test_mqar_circuit_reads_the_weights_where_the_circuit_needs_them(bench_script, monkeypatch):
    from effiformer.tasks.mqar import MQARTask

    script = bench_script("mqar_circuit")
    task = MQARTask(seq_len=64, batch_size=4, seed=0)
    x, y = task.split("test")
    x = x[:3]
    b, t = x.shape
    n = task.n_pairs
    # layer 0: every position of the pairs attends to the one before it (position 0 and those
    # after the pairs to themselves); layer 1: every query attends to its pair's value in head 1
    # and to the first key in head 0, every other position to itself
    prev = torch.eye(t).expand(b, 2, t, t).clone()
    prev[:, :, torch.arange(1, 2 * n)] = 0.0
    prev[:, :, torch.arange(1, 2 * n), torch.arange(2 * n - 1)] = 1.0
    recall = torch.eye(t).expand(b, 2, t, t).clone()
    queries = 0
    for row in range(b):
        keys = x[row, 0 : 2 * n : 2].tolist()
        for q in (y[row] != -100).nonzero().flatten().tolist():
            recall[row, :, q] = 0.0
            recall[row, 1, q, 2 * keys.index(int(x[row, q])) + 1] = 1.0  # head 1 only
            recall[row, 0, q, 0] = 1.0  # a key: never a value nor the position after one
            queries += 1
    assert queries > b
    monkeypatch.setattr(script, "layer_probs", lambda model, x_: [prev, recall])
    l0, l1 = script.circuit(None, task, sequences=b)
    assert l0["previous"] == 1.0 and l0["recall"] == 0.0 and l0["values"] == 0.0
    assert l0["next_key"] == 1.0  # the key after a pair puts its weight on the pair's value
    assert l0["recent"] == 1.0  # distance 1 is within the last 8 positions
    assert l1["recall"] == 1.0 and l1["recall_head"] == 1 and l1["recall_next"] == 0.0
    assert l1["values"] == 1.0 and l1["previous"] == 0.0
    assert l1["recent"] < 1.0  # the values lie farther back than 8 positions for some queries


def test_mqar_circuit_dense_weights_reproduce_the_layer_output(bench_script):
    from effiformer.attention import AttentionMask
    from effiformer.attention.dense import DenseAttention

    script = bench_script("mqar_circuit")
    torch.manual_seed(0)
    m = DenseAttention(16, 2, 8)
    h = torch.randn(2, 10, 16)

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = m

        def forward(self, x):
            return self.attn(x, mask=AttentionMask(causal=True))

    (p,) = script.layer_probs(One(), h)
    assert p.shape == (2, 2, 10, 10)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 2, 10))
    assert (p.triu(1) == 0).all()  # causal
    v = m._heads(m.v_proj(h))
    o = (p @ v).transpose(1, 2).reshape(2, 10, 16)
    expect = m(h, mask=AttentionMask(causal=True)).out
    torch.testing.assert_close(m.o_proj(o), expect, atol=1e-5, rtol=1e-5)


def test_mqar_circuit_on_a_smoke_cell_and_its_refusals(tmp_path, bench_script):
    script = bench_script("mqar_circuit")
    out = tmp_path / "q"
    threads = torch.get_num_threads()
    try:
        recs = run_quality(["mqar", "duplication"], ["dense", "local"], budget="smoke", out=out,
                           progress=False)  # fmt: skip
        cell = {(r["task"], r["mechanism"]): r for r in recs}
        mqar = cell["mqar", "dense"]
        argv = ["--out", str(out), "--min-len", "16", "--cells"]
        # refusals: one line, exit 2, nothing written
        assert script.main([*argv, "mqar/dense/T64/lr0.1/s0"]) == 2
        assert script.main([*argv, mqar["cell"], cell["duplication", "dense"]["cell"]]) == 2
        assert script.main([*argv, cell["mqar", "local"]["cell"]]) == 2  # no weights to read
        assert script.main(["--out", str(out), "--min-len", "48", "--cells", mqar["cell"]]) == 2
        assert not (out / "circuit.jsonl").exists()
        assert script.main([*argv, mqar["cell"]]) == 0
        with open(out / "circuit.jsonl", "a") as f:  # another cell's rows stay
            f.write(json.dumps({**json.loads((out / "circuit.jsonl").read_text().splitlines()[0]),
                                "cell": "other"}) + "\n")  # fmt: skip
        assert script.main([*argv, mqar["cell"]]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (out / "circuit.jsonl").read_text().splitlines()]
    assert [r["cell"] for r in rows][0] == "other"
    mine = [r for r in rows if r["cell"] == mqar["cell"]]
    assert [(r["length"], r["layer"]) for r in mine] == [(16, 0), (32, 0), (64, 0)]  # one layer
    assert mine[0]["next_key"] is None  # one pair at 16 tokens: no key after a pair
    for r in mine:
        for k in ("previous", "next_key", "recall", "recall_next", "values", "recent"):
            assert r[k] is None or 0.0 <= r[k] <= 1.0 + 1e-6
    assert f"| {mqar['cell']} |" in (out / "circuit.md").read_text()


def test_quality_diagnose_keeps_rows_of_cells_whose_checkpoint_is_gone(tmp_path, bench_script):
    script = bench_script("quality_diagnose")
    out = tmp_path / "q"
    threads = torch.get_num_threads()
    try:
        assert script.main(["--out", str(out)]) == 2  # no results.jsonl: refused, nothing written
        assert not out.exists()
        recs = run_quality(["mqar"], ["dense", "routing"], budget="smoke", out=out,
                           progress=False)  # fmt: skip
        dense, routing = (
            next(r for r in recs if r["mechanism"] == m) for m in ("dense", "routing")
        )
        with open(out / "results.jsonl", "a") as f:  # a cell recorded twice: one row, the last
            f.write(json.dumps(dense) + "\n")
        earlier = {"cell": "mqar/local/T64/lr0.001/s0", "mechanism": "local", "length": 64,
                   "accuracy": 0.5, "by_distance": {"1-1": {"accuracy": 0.5}}}  # fmt: skip
        (out / "diagnostics.jsonl").write_text(
            json.dumps(earlier) + "\n" + json.dumps({**earlier, "cell": dense["cell"]}) + "\n"
        )
        assert script.main(["--out", str(out), "--sequences", "4"]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (out / "diagnostics.jsonl").read_text().splitlines()]
    cells = [r["cell"] for r in rows]
    assert cells[0] == earlier["cell"] and rows[0] == earlier  # kept as it was
    assert cells.count(dense["cell"]) == 1  # measured again: replaced, not duplicated
    assert next(r for r in rows if r["cell"] == dense["cell"])["accuracy"] != 0.5
    assert cells.count(routing["cell"]) == 2  # its breakdown and its co-location rows
    md = (out / "diagnostics.md").read_text()
    assert f"| {earlier['cell']} | 50.0% |" in md and "| routing cell | layer |" in md
