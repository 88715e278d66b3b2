"""Latency datasets: HAT's CSV format, feature extraction, exact resume, real measurements."""

import csv
import dataclasses
import json

import pytest
import torch

from effiformer.bench.decoding import DecodingLatency
from effiformer.models.hat import LATENCY_SPACES, TINY_SPACE, SubTransformer, sample_generator
from effiformer.search.features import FEATURE_NAMES, LATENCY_COLUMNS, hat_features
from effiformer.search.latency import (
    LatencySettings,
    build_latency_dataset,
    measure_subtransformer,
    read_latency_csv,
)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_features_average_the_active_layers_only():
    sub = SubTransformer(
        encoder_dim=512, decoder_dim=640, encoder_layers=2, decoder_layers=2,
        encoder_ffn=(1024, 3072, 9999), encoder_heads=(4, 8, 99), decoder_ffn=(2048, 1024, 7),
        decoder_heads=(8, 4, 1), cross_heads=(4, 4, 1), attend=(1, 2, 3),
    )  # fmt: skip
    assert hat_features(sub) == [512, 2, 2048, 6, 640, 2, 1536, 6, 4, 1.5]
    assert hat_features(sub) == hat_features(sub.trimmed())
    # HAT's -1 / 1 / 2 codes are 1 / 2 / 3 layers
    hat = SubTransformer.from_hat(sub.to_hat())
    assert hat == sub.trimmed() and sub.to_hat()[
        "decoder-arbitrary-ende-attn-all-subtransformer"
    ] == [-1, 1]


def _fake(sub):
    f = hat_features(sub)
    ms = 1e-3 * (f[0] / 10 + f[5] * 3 + f[6] / 100)
    return DecodingLatency(ms / 3, 2 * ms / 3, ms, 7, 7, 5, 1, (ms,), 0.0, 1e-5)


def test_dataset_is_hats_csv_and_resumes_exactly(tmp_path):
    space = LATENCY_SPACES["tiny"]
    settings = LatencySettings(vocab_size=64, src_len=7, runs=1, warmup=0, seed=3)
    full = build_latency_dataset(tmp_path / "a.csv", space, 12, settings, measure=_fake,
                                 progress=False)  # fmt: skip
    with open(tmp_path / "a.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == [*FEATURE_NAMES, *LATENCY_COLUMNS] and len(rows) == 13
    assert all(len(r) == 14 for r in rows)
    for i, sub in enumerate(full.subs):  # sample i is drawn from (seed, i) alone
        assert sub == space.sample(sample_generator(3, i)).trimmed()
        assert full.features[i].tolist() == hat_features(sub)
    assert full.latency_ms[0] == pytest.approx(_fake(full.subs[0]).total_s * 1e3)
    # Interrupted after 5 rows, with a half-written sidecar line: resume gives the same file.
    build_latency_dataset(tmp_path / "b.csv", space, 5, settings, measure=_fake, progress=False)
    with open(tmp_path / "b.csv.jsonl", "a") as f:
        f.write('{"index": 5, "sub": {"enc')
    resumed = build_latency_dataset(tmp_path / "b.csv", space, 12, settings, measure=_fake,
                                    progress=False)  # fmt: skip
    assert (tmp_path / "b.csv").read_text() == (tmp_path / "a.csv").read_text()
    assert resumed.subs == full.subs
    with pytest.raises(ValueError, match="other settings"):
        build_latency_dataset(tmp_path / "b.csv", space, 12,
                              dataclasses.replace(settings, beam=4), measure=_fake)  # fmt: skip
    with pytest.raises(FileExistsError):
        build_latency_dataset(tmp_path / "b.csv", space, 12, settings, resume=False)
    meta = json.loads((tmp_path / "a.csv.jsonl").read_text().splitlines()[0])
    assert meta["settings"]["beam"] == 5 and meta["space"]["qkv_dim"] == TINY_SPACE.qkv_dim


def test_a_real_measurement_goes_through_decoding_latency(tmp_path):
    settings = LatencySettings(vocab_size=64, src_len=6, runs=2, warmup=1)
    sub = TINY_SPACE.smallest()
    lat = measure_subtransformer(sub, TINY_SPACE, settings)
    assert lat.beam == 5 and lat.steps == 6 and lat.runs == 2 and lat.threads == 1
    assert lat.encoder_s > 0 and lat.total_s >= lat.decoder_s
    data = build_latency_dataset(tmp_path / "r.csv", LATENCY_SPACES["tiny"], 2, settings,
                                 progress=False)  # fmt: skip
    assert len(data) == 2 and (data.latency_ms > 0).all()
    assert read_latency_csv(tmp_path / "r.csv").subs == data.subs
    with pytest.raises(ValueError, match="not a HAT latency file"):
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
        read_latency_csv(tmp_path / "bad.csv")
