"""The benchmark scripts run end to end on a tiny model and write their JSON and tables."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import reversal_pairs, tiny_recipe, write_prepared
from support.cli import run_cli

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import common  # noqa: E402


def test_flops_of_the_anchor_model():
    """ANCHORS.md: d 256, FFN 1024, 3+3 layers, tied 8k vocabulary cost ~45 MFLOP per
    target token to train (matmuls; attention adds a little at ~30-piece sentences)."""
    model = dict(d_model=256, ffn_dim=1024, encoder_layers=3, decoder_layers=3)
    flops = common.transformer_flops(model, 8000, src_len=30, tgt_len=30)
    assert 45e6 < flops["train_per_tgt_token"] < 47e6


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("bench")
    write_prepared(work, reversal_pairs(300, 0, length=6), reversal_pairs(12, 1, length=6))
    recipe = tiny_recipe(work, train={"max_steps": 10, "validate_every": 10, "save_every": 10})
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    done = run_cli("train", str(work / "recipe.yaml"))
    assert done.returncode == 0, done.stderr.decode()
    return work / "train" / "best", work / "prepared"


def test_train_profile_times_the_trainers_matrix_products(trained, tmp_path, monkeypatch):
    import tempfile

    import train_profile

    assert train_profile.product_flops("aten::mm", [[3, 5], [5, 7]]) == ([3, 5], [5, 7], 2 * 3 * 5 * 7)
    assert train_profile.product_flops("aten::addmm", [[7], [3, 5], [5, 7], [], []])[2] == 2 * 3 * 5 * 7
    assert train_profile.product_flops("aten::bmm", [[4, 3, 5], [4, 5, 7]])[2] == 2 * 4 * 3 * 5 * 7
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    _, data = trained
    record = train_profile.main(["--work", str(data.parent), "--recipe", str(data.parent / "recipe.yaml"),
                                 "--dtype", "float32", "--steps", "2", "--warmup", "1", "--threads", "1",
                                 "--out", str(tmp_path / "out")])
    d_model = yaml.safe_load((data.parent / "recipe.yaml").read_text())["model"]["d_model"]
    assert record["products"] and all(r["gflops"] > 0 and r["calls"] > 0 for r in record["products"])
    assert any(d_model in r["a"] or d_model in r["b"] for r in record["products"])  # the layers' own widths
    assert 0 < record["products_share_pct"] < 100 and record["tgt_tok_s_under_profiler"] > 0
    assert "| product |" in (tmp_path / "out" / "train_profile.md").read_text()
    assert list(scratch.glob("nmtkit-train-profile-*")) == []  # its run directory is gone


def test_decode_profile_names_the_search_operators(trained, tmp_path):
    import decode_profile

    model, data = trained
    record = decode_profile.main(["--model", str(model), "--source", str(data / "dev.src"), "--lines", "6",
                                  "--beam", "2", "--dtype", "float32", "--rows", "500", "--out", str(tmp_path)])
    names = [r["op"] for r in record["ops"]]
    assert "aten::topk" in names and any("linear" in n or n in ("aten::addmm", "aten::mm") for n in names)
    assert record["lines"] == 6 and record["sent_s_under_profiler"] > 0
    assert 99.5 < sum(r["share_pct"] for r in record["ops"]) <= 100.5  # every operator, shares of the whole
    assert "| aten::topk |" in (tmp_path / "decode_profile.md").read_text()


def test_train_decode_and_startup_benchmarks_write_results(trained, tmp_path):
    import decode_speed
    import startup
    import train_speed

    model, data = trained
    shared = ["--model", str(model), "--data", str(data), "--out", str(tmp_path), "--threads", "1"]
    train = train_speed.main([*shared, "--recipe", str(data.parent / "recipe.yaml"), "--dtypes", "float32",
                              "--steps", "6", "--log-every", "2", "--warmup-windows", "1", "--peak-seconds", "0.05"])
    assert train[0]["tgt_tok_s"] > 0 and train[0]["peak_rss_mib"] > 50 and train[0]["mfu_pct"] > 0
    assert train[0]["matmul_peak"]["seconds_each"] == 0.05  # a quick peak: it is not what this test is about
    has_ct2 = decode_speed.available("ct2")
    # each configuration is a fresh process (seconds of imports), so each engine path runs once; on
    # one thread ct2direct's :w2 searches one batch at a time, as its default (the forced run) does
    engines = "torch:float32:2,torch:int8:1" + (",ct2:float32:1,ct2direct:float32:1:w2" if has_ct2 else "")
    forced_engines = "torch:float32:2" + (",ct2direct:int8:2" if has_ct2 else "")
    decode = decode_speed.main([*shared, "--configs", engines, "--forced-configs", forced_engines,
                                "--forced-len", "3", "--max-sentences", "8", "--warmup", "2", "--keep-outputs",
                                "--peak-seconds", "0.05"])

    def tag(config: str) -> str:  # engine:dtype:beam[:wN] -> engine-dtype-bBEAM[-wN]
        engine, dtype, beam, *workers = config.split(":")
        return f"{engine}-{dtype}-b{beam}" + "".join(f"-{w}" for w in workers)

    assert [r["config"] for r in decode] == [tag(c) for c in engines.split(",")] + \
        [tag(c) + "-forced3" for c in forced_engines.split(",")]
    # two batches side by side on two threads translate as one batch at a time did
    side = decode_speed.main([*shared[:-1], "2", "--configs", "torch:float32:2:w2", "--forced-len", "0",
                              "--max-sentences", "8", "--warmup", "2", "--batch-tokens", "40", "--keep-outputs",
                              "--out", str(tmp_path / "side"), "--peak-seconds", "0.05"])
    assert [(r["config"], r["workers"]) for r in decode[:1] + side] == [("torch-float32-b2", 0),
                                                                         ("torch-float32-b2-w2", 2)]
    assert side[0]["threads_used"] == 2 and side[0]["tgt_tokens"] == decode[0]["tgt_tokens"]
    assert (tmp_path / "side" / "torch-float32-b2-w2.txt").read_text() == \
        (tmp_path / "torch-float32-b2.txt").read_text()
    with pytest.raises(SystemExit, match="ct2:int8:4:w2: :wN applies to torch and ct2direct only"):
        decode_speed.parse_configs("torch:bf16:4:w2,ct2:int8:4:w2")
    float32 = [r for r in decode + side if r["dtype"] == "float32"]
    assert float32 and all(r["matmul_peak_seconds"] == 0.05 and "mfu_pct" in r for r in float32)
    for seconds in ("0", "inf"):  # no peak to divide by, or one never measured: refused by argparse
        with pytest.raises(SystemExit) as refused:
            decode_speed.main([*shared, "--peak-seconds", seconds])
        assert refused.value.code == 2
    for record in decode + side:
        assert record["sentences"] == 8 and record["sent_s"] > 0
    assert all("bleu" in r for r in decode + side if not r["forced_len"])
    for forced in (r for r in decode if r["forced_len"]):
        assert forced["tgt_tokens"] == 8 * 3, forced["config"]  # exactly the forced length per sentence
    if has_ct2:  # CTranslate2 alone and through nmtkit: same export, same greedy search, same lines
        direct = (tmp_path / "ct2direct-float32-b1-w2.txt").read_text(encoding="utf-8")
        assert direct == (tmp_path / "ct2-float32-b1.txt").read_text(encoding="utf-8")
        assert len(direct.splitlines()) == 8
    records = startup.main([*shared, "--repeats", "1"])
    assert records[0]["what"] == "nmtkit --help" and all(r["median_s"] > 0 for r in records)
    first = {r["what"]: r for r in records if r["what"].startswith("launch to first line")}
    exported = [", ctranslate2 export"] if has_ct2 else []
    assert sorted(first) == sorted(f"launch to first line, {way}{label}" for way in ("file", "piped")
                                   for label in ["", *exported])
    assert first["launch to first line, piped"]["command"].startswith("echo LINE | nmtkit -q translate -m ")
    assert first["launch to first line, file"]["command"].endswith(" -i FILE")
    for name in ("train_speed", "decode_speed", "startup"):
        payload = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
        assert payload["records"] and payload["machine"]["cores"] >= 1
        assert (tmp_path / f"{name}.md").read_text(encoding="utf-8").startswith("## ")


def test_startup_phases_split_one_translation_into_its_phases(model_dir, tmp_path):
    """Every phase is marked in the child, in order: the phases are non-negative and the total
    holds each of them."""
    out = tmp_path / "phases.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "startup_phases.py"), "--model", str(model_dir),
                           "--tree", str(BENCHMARKS.parent), "--runs", "1", "--json", str(out)],
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    phases = json.loads(out.read_text(encoding="utf-8"))["medians"][str(BENCHMARKS.parent)]
    assert list(phases) == ["to the command", "imports (torch)", "options, side files", "model load",
                            "first search", "to first line"]
    total_wall, total_cpu = phases.pop("to first line")
    assert all(wall >= 0 and cpu >= 0 for wall, cpu in phases.values())
    assert sum(wall for wall, _ in phases.values()) <= total_wall + 0.002  # rounding of each part
    assert done.stdout.decode().startswith("| phase (median of 1")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self")
def test_decode_memory_reports_rss_after_each_batch_and_where_it_lies(trained):
    import decode_memory

    model, data = trained
    report = decode_memory.main(["--model", str(model), "--data", str(data), "--dtype", "float32", "--beam", "2",
                                 "--batches", "3", "--batch-lines", "2",
                                 "--untuned"])  # leaves this test process's malloc and environment alone
    assert len(report["rss_after_batches_mib"]) == 3 and min(report["rss_after_batches_mib"]) > 50
    kinds = report["resident_by_kind_mib"]
    assert set(kinds) <= {"heap", "anon", "jit code", "files"} and kinds["heap"] + kinds["files"] > 20


def test_constraints_benchmark_compares_sets_at_each_beam(trained, tmp_path):
    import constraints_speed

    model, data = trained
    records = constraints_speed.main(["--model", str(model), "--data", str(data), "--out", str(tmp_path),
                                      "--threads", "1", "--sets", "plain,empty,1x1,1x2", "--beams", "2",
                                      "--max-sentences", "6", "--warmup", "2"])
    assert [r["config"] for r in records] == [f"b2-{s}" for s in ("plain", "empty", "1x1", "1x2")]
    for record in records:
        assert record["sentences"] == 6 and record["sent_s"] > 0 and record["vs_plain"] > 0
        assert record["met"] == (None if record["set"] in ("plain", "empty") else 1.0)  # room for every phrase
    refs = (data / "test.tgt").read_text(encoding="utf-8").splitlines()
    assert constraints_speed.phrases_from(refs[0], 2, 1, seed=0)[0] in refs[0].split()
    assert (tmp_path / "constraints_speed.md").read_text(encoding="utf-8").startswith("## ")


def test_joeynmt_peer_gets_our_dimensions_and_training_settings(tmp_path):
    """The peer must train the same model the same way, or its ratio means nothing."""
    import argparse

    import train_speed

    meta = {"model": {"d_model": 256, "ffn_dim": 1024, "heads": 4, "encoder_layers": 3, "decoder_layers": 2,
                      "dropout": 0.1, "pre_norm": False},
            "spm": {"src": "spm.model", "tgt": "spm.model"}, "src_lang": "en", "tgt_lang": "es"}
    recipe = {"train": {"lr": 0.0007, "warmup": 4000, "label_smoothing": 0.1, "max_tokens": 2048}}
    args = argparse.Namespace(model=str(tmp_path / "model"), max_tokens=4096, steps=30, log_every=5)
    cfg = train_speed.joeynmt_config(meta, recipe, tmp_path / "prepared", tmp_path, args)
    enc, dec = cfg["model"]["encoder"], cfg["model"]["decoder"]
    assert (enc["num_layers"], dec["num_layers"]) == (3, 2)
    for stack in (enc, dec):
        assert (stack["hidden_size"], stack["ff_size"], stack["num_heads"]) == (256, 1024, 4)
        assert stack["embeddings"] == {"embedding_dim": 256, "scale": True} and stack["layer_norm"] == "post"
    assert cfg["model"]["tied_embeddings"] and cfg["model"]["tied_softmax"]
    train = cfg["training"]
    assert (train["batch_size"], train["batch_type"], train["updates"]) == (4096, "token", 30)  # --max-tokens wins
    assert (train["learning_rate"], train["learning_rate_warmup"], train["label_smoothing"]) == (0.0007, 4000, 0.1)
    assert train["adam_betas"] == [0.9, 0.98] and train["logging_freq"] == 5
    assert cfg["data"]["train"] == str(tmp_path / "prepared" / "train")
    assert cfg["data"]["src"]["lang"] == "en" and cfg["data"]["trg"]["lang"] == "es"
    assert cfg["data"]["src"]["tokenizer_cfg"]["model_file"] == str((tmp_path / "model" / "spm.model").resolve())


def test_unknown_peer_is_a_clear_error(trained, tmp_path):
    import train_speed

    model, data = trained
    with pytest.raises(SystemExit, match="unknown peer 'opennmt'"):
        train_speed.main(["--model", str(model), "--data", str(data), "--out", str(tmp_path), "--threads", "1",
                          "--dtypes", "", "--peers", "opennmt", "--recipe", str(data.parent / "recipe.yaml")])


def test_scale_corpus_joins_two_or_three_random_pairs(tmp_path):
    """benchmarks/scale.py's synthetic corpus: every pair joins 2-3 source pairs, both sides alike, almost
    never the same pair twice (deduplication would otherwise shrink the corpus)."""
    import scale

    text = tmp_path / "prepared"
    text.mkdir()
    for split in ("train", "dev", "test"):
        for lang, word in (("en", "e"), ("es", "s")):
            lines = "".join(f"{word}{i}\n" for i in range(100)).encode()
            if split == "train":  # kept compressed by prepare
                (text / f"train.{lang}.gz").write_bytes(gzip.compress(lines))
            else:
                (text / f"{split}.{lang}").write_bytes(lines)
    out = tmp_path / "corpus"
    out.mkdir()
    files = scale.synthetic_corpus(text, ("en", "es"), 250, out, seed=0)
    assert files["dev"]["es"] == str(out / "dev.es") and (out / "dev.es").read_text() == (text / "dev.es").read_text()
    src, tgt = ((out / f"train.{lang}").read_text().splitlines() for lang in ("en", "es"))
    assert len(src) == len(tgt) == 250
    spans = set()
    for source, target in zip(src, tgt):
        numbers = [int(word[1:]) for word in source.split()]
        assert target == " ".join(f"s{i}" for i in numbers) and all(0 <= i < 100 for i in numbers)
        spans.add(len(numbers))
    assert spans == {2, 3}
    scale.synthetic_corpus(text, ("en", "es"), 5, out, seed=0, dev_pairs=30)  # a larger dev set of joins
    dev = [(s, t) for s, t in zip(*((out / f"dev.{lang}").read_text().splitlines() for lang in ("en", "es")))]
    assert len(dev) == 30 and all(t == s.replace("e", "s") and len(s.split()) in (2, 3) for s, t in dev)
    assert (out / "test.en").read_text() == (text / "test.en").read_text()
    assert len(set(src)) >= 245  # of ~10^6 possible joins, 250 draws almost never repeat


def fairseq_args(tmp_path, **overrides):
    import argparse

    values = dict(model=str(tmp_path / "model"), max_tokens=0, steps=30, log_every=5)
    return argparse.Namespace(**{**values, **overrides})


def test_fairseq_peer_gets_our_dimensions_and_training_settings(tmp_path):
    """fairseq must train the same model the same way as ours, or its ratio means nothing."""
    import fairseq_peer

    meta = {"model": {"arch": "transformer", "d_model": 256, "ffn_dim": 1024, "heads": 4, "encoder_layers": 3,
                      "decoder_layers": 2, "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0,
                      "pre_norm": False, "tie_embeddings": "all", "max_positions": 512},
            "spm": {"src": "spm.model", "tgt": "spm.model"}, "src_lang": "en", "tgt_lang": "es"}
    recipe = {"train": {"lr": 0.001, "warmup": 300, "label_smoothing": 0.1, "max_tokens": 2048, "betas": [0.9, 0.98],
                        "eps": 1e-9, "update_freq": 1, "seed": 1}}
    argv = fairseq_peer.fairseq_train_argv(meta, recipe, tmp_path / "bin", fairseq_args(tmp_path))
    options = dict(zip(argv[3::2], argv[4::2]))  # after "-m fairseq_cli.train DATA": --key value pairs, then flags
    expected = {"--encoder-layers": "3", "--decoder-layers": "2", "--encoder-embed-dim": "256",
                "--decoder-embed-dim": "256", "--encoder-ffn-embed-dim": "1024", "--decoder-ffn-embed-dim": "1024",
                "--encoder-attention-heads": "4", "--decoder-attention-heads": "4", "--dropout": "0.1",
                "--source-lang": "en", "--target-lang": "es", "--criterion": "label_smoothed_cross_entropy",
                "--label-smoothing": "0.1", "--adam-betas": "(0.9,0.98)", "--lr-scheduler": "inverse_sqrt",
                "--lr": "0.001", "--warmup-updates": "300", "--max-tokens": "2048", "--max-update": "30",
                "--log-interval": "5", "--log-format": "json", "--num-workers": "0"}
    assert {key: options.get(key) for key in expected} == expected
    assert {"--cpu", "--no-save", "--share-all-embeddings"} <= set(argv) and "--encoder-normalize-before" not in argv
    pre_norm = {**meta, "model": {**meta["model"], "pre_norm": True, "tie_embeddings": "decoder"}}
    argv = fairseq_peer.fairseq_train_argv(pre_norm, recipe, tmp_path / "bin", fairseq_args(tmp_path, max_tokens=4096))
    assert {"--encoder-normalize-before", "--decoder-normalize-before", "--share-decoder-input-output-embed"} <= set(argv)
    assert "--share-all-embeddings" not in argv and argv[argv.index("--max-tokens") + 1] == "4096"  # --max-tokens wins
    swiglu = {**meta, "model": {**meta["model"], "ffn": "swiglu"}}
    with pytest.raises(SystemExit, match="cannot train {'ffn': 'swiglu'}"):
        fairseq_peer.fairseq_train_argv(swiglu, recipe, tmp_path / "bin", fairseq_args(tmp_path))


def test_fairseq_peer_reads_our_ids_and_vocabulary(trained, tmp_path):
    """The pieces fairseq binarises are our prepared ids, and its dictionary our V pieces."""
    import sentencepiece

    import fairseq_peer
    from nmtkit.data.ids import load_split

    model, data = trained
    meta = json.loads((model / "config.json").read_text(encoding="utf-8"))
    options = fairseq_peer.write_text(data, model, meta, tmp_path)
    assert options == {"--joined-dictionary": True, "--srcdict": tmp_path / "dict.src.txt", "--tgtdict": None}
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model / meta["spm"]["src"]))
    lines = (tmp_path / "dict.src.txt").read_text(encoding="utf-8").splitlines()
    assert 4 + len(lines) == sp.vocab_size()  # fairseq's <s> <pad> </s> <unk>, then ours: the same V
    assert [line.rsplit(" ", 1)[0] for line in lines] == [sp.id_to_piece(i) for i in range(4, sp.vocab_size())]
    for split in ("train", "dev"):
        ids = load_split(data / f"{split}.npz")
        for side in ("src", "tgt"):
            text = (tmp_path / f"{split}.{meta[side + '_lang']}").read_text(encoding="utf-8").splitlines()
            assert len(text) == len(ids)
            flat = [sp.piece_to_id(piece) for line in text for piece in line.split()]
            assert flat == getattr(ids, side).tolist()


def test_fairseq_dictionary_leaves_out_the_specials():
    import fairseq_peer

    text = fairseq_peer.fairseq_dictionary(["<pad>", "<unk>", "▁a", "b", "</s>"], [True, True, False, False, True])
    assert text == "▁a 1\nb 1\n"


# Lines of a real fairseq-fixed 0.12.3.1 run (fairseq_peer.fairseq_train_argv, quickstart data, 2026-11-24).
FAIRSEQ_LOG = """\
2026-11-24 03:40:36 | INFO | fairseq.tasks.translation | [en] dictionary: 8000 types
2026-11-24 03:40:36 | INFO | fairseq.tasks.translation | [es] dictionary: 8000 types
2026-11-24 03:40:55 | INFO | train_inner | {"epoch": 1, "update": 0.007, "loss": "13.781", "nll_loss": "13.787", "ppl": "14136.2", "wps": "514.4", "ups": "0.28", "wpb": "1878.5", "bsz": "58", "num_updates": "4", "lr": "1.33333e-05", "gnorm": "4.546", "train_wall": "15", "wall": "19"}
2026-11-24 03:41:09 | INFO | train_inner | {"epoch": 1, "update": 0.014, "loss": "13.483", "nll_loss": "13.456", "ppl": "11233.9", "wps": "506.2", "ups": "0.3", "wpb": "1703.8", "bsz": "40", "num_updates": "8", "lr": "2.66667e-05", "gnorm": "4.505", "train_wall": "13", "wall": "32"}
2026-11-24 03:41:39 | INFO | valid | {"epoch": 1, "valid_loss": "12.536", "valid_nll_loss": "12.404", "valid_ppl": "5418.53", "valid_wps": "976.3", "valid_wpb": "1313.8", "valid_bsz": "41.3", "valid_num_updates": "12"}
2026-11-24 03:41:39 | INFO | train | {"epoch": 1, "train_loss": "13.421", "train_nll_loss": "13.387", "train_ppl": "10715.9", "train_wps": "343.3", "train_ups": "0.2", "train_wpb": "1728.7", "train_bsz": "47.3", "train_num_updates": "12", "train_lr": "4e-05", "train_gnorm": "4.298", "train_train_wall": "43", "train_wall": "63"}
"""


def test_fairseq_log_gives_train_inner_rates_and_dictionary_sizes():
    """Lines as fairseq-train 0.12 logs them with --log-format json (epoch summaries are not windows)."""
    import fairseq_peer

    assert fairseq_peer.fairseq_rates(FAIRSEQ_LOG) == [514.4, 506.2]  # the train_inner lines only
    assert fairseq_peer.dictionary_size(FAIRSEQ_LOG) == {"en": 8000, "es": 8000}


def test_nmtkit_records_get_their_ratios_to_each_peer():
    import train_speed

    records = [{"toolkit": "nmtkit", "dtype": "bf16", "tgt_tok_s": 6000.0, "peak_rss_mib": 1000.0},
               {"toolkit": "nmtkit", "dtype": "float32", "tgt_tok_s": 3000.0, "peak_rss_mib": 900.0},
               {"toolkit": "joeynmt", "dtype": "float32", "tgt_tok_s": 600.0, "peak_rss_mib": 3000.0},
               {"toolkit": "fairseq", "dtype": "float32", "tgt_tok_s": 1500.0, "peak_rss_mib": 1600.0}]
    for record in records:
        train_speed.compare_with_peers(record, records)
    assert records[0] == {**records[0], "x_fairseq_tok_s": 4.0, "x_fairseq_rss": 0.62, "x_joeynmt_tok_s": 10.0}
    assert "x_peer" not in records[0]  # no peer trained in bf16
    assert (records[1]["x_peer"], records[1]["x_fairseq_tok_s"], records[1]["x_joeynmt_rss"]) == (2.0, 2.0, 0.3)
    assert "x_fairseq_tok_s" not in records[3]


def test_table3_mini_places_every_variant_of_the_shipped_sweep_beside_the_paper():
    import table3_mini

    from nmtkit.sweep.spec import load_sweep

    sweep = load_sweep(BENCHMARKS.parent / "recipes" / "sweeps" / "table3-mini.yaml")
    assert [v.name for v in sweep.variants] == [name for name, *_ in table3_mini.OURS]
    rows = [{"name": v.name, "status": "pending", "parameters": 7_577_600} for v in sweep.variants]
    rows[0].update(status="done", dev_loss=3.1234, dev_bleu=19.0, test_bleu=17.13, p_value=None)
    rows[1].update(status="done", dev_loss=3.3, dev_bleu=17.5, test_bleu=16.0, p_value=0.004)
    lines = table3_mini.table([{"variants": rows}]).splitlines()
    assert len(lines) == 2 + len(rows)
    assert "| base | 1 | d 256" in lines[2] and "| 3.123 | 19.00 | 17.13 | — | 7.6M |" in lines[2] and "25.8, 65M |" in lines[2]
    assert "| A | 1 | 1 head of 256 | 3.300 | 17.50 (−1.5) | 16.00 | 0.004 | 7.6M | 1 head of 512 | 24.9 (−0.9), 65M |" == lines[3]
    assert "| — | 2 heads of 128 | pending | — | — | — | 7.6M |" in lines[4]
    with pytest.raises(SystemExit, match="does not place: extra"):
        table3_mini.table([{"variants": rows + [{"name": "extra", "status": "pending", "parameters": 1}]}])


def test_table3_mini_takes_each_row_from_the_latest_sitting_and_compares_it_with_that_sittings_base():
    import table3_mini

    first = [{"name": "base", "status": "done", "dev_loss": 3.1, "dev_bleu": 19.0, "test_bleu": 17.0, "parameters": 7e6},
             {"name": "C-layers-2", "status": "done", "dev_loss": 3.0, "dev_bleu": 20.0, "test_bleu": 18.0,
              "p_value": 0.001, "parameters": 5e6},
             {"name": "C-layers-6", "status": "running", "parameters": 13e6}]
    second = [{"name": "base", "status": "done", "dev_loss": 3.2, "dev_bleu": 18.5, "test_bleu": 17.5, "parameters": 7e6},
              {"name": "C-layers-2", "status": "pending", "parameters": 5e6},
              {"name": "C-layers-6", "status": "done", "dev_loss": 3.4, "dev_bleu": 16.0, "test_bleu": 15.0,
               "p_value": 0.002, "parameters": 13e6}]
    lines = table3_mini.table([{"variants": first}, {"variants": second}]).splitlines()[2:]
    bases = [line for line in lines if line.startswith("| base |")]
    assert [line.split(" | ")[1] for line in bases] == ["1", "2"]  # each contributing sitting shows its base
    assert "| 3.200 | 18.50 | 17.50 | — |" in bases[1]
    two = next(line for line in lines if "| 2+2 layers |" in line)
    assert "| C | 1 | 2+2 layers | 3.000 | 20.00 (+1.0) | 18.00 | 0.001 |" in two  # against sitting 1's base
    six = next(line for line in lines if "| 6+6 layers |" in line)
    assert "| C | 2 | 6+6 layers | 3.400 | 16.00 (−2.5) | 15.00 | 0.002 |" in six  # against sitting 2's base
    pending = next(line for line in lines if "| 4+4 layers |" in line)
    assert "| C | — | 4+4 layers | pending |" in pending

    third = [{"name": "C-layers-4", "status": "done", "dev_loss": 3.3, "dev_bleu": 15.0, "test_bleu": 14.0,
              "p_value": None, "parameters": 9e6}]  # a sitting without its base: its base shows as pending
    lines = table3_mini.table([{"variants": first}, {"variants": second}, {"variants": third}]).splitlines()[2:]
    assert [line.split(" | ")[1] for line in lines if line.startswith("| base |")] == ["1", "2", "3"]
    assert "| base | 3 | d 256, FFN 1024, 3+3 layers, 4 heads of 64, post-norm, sinusoidal | pending |" in lines[2]
    assert "| C | 3 | 4+4 layers | 3.300 | 15.00 | 14.00 | — |" in next(line for line in lines if "| 4+4 layers |" in line)
    assert table3_mini.table([{"variants": []}]).splitlines()[2].startswith("| base | — |")


def test_learning_curve_points_carry_the_runs_training_minutes(trained, tmp_path):
    """BLEU per minute needs each point's training time: the checkpoint's, which the metrics
    log shows too; a step without its checkpoint has none."""
    import learning_curve

    from nmtkit.runlog import read_metrics
    from nmtkit.training.checkpoint import checkpoint_dirs, checkpoint_step, read_trainer_state

    run = trained[1].parent / "train"
    [checkpoint] = [path for path in checkpoint_dirs(run) if checkpoint_step(path) == 10]
    seconds = read_trainer_state(checkpoint).train_seconds
    logged = [r["train_seconds"] for r in read_metrics(run) if r.get("type") == "train" and r["step"] == 10]
    assert seconds > 0 and logged and abs(logged[0] - seconds) < 1.0
    assert learning_curve.train_minutes(run.parent, 10) == round(seconds / 60, 2)
    assert learning_curve.train_minutes(run.parent, 7) is None


def test_learning_curve_draws_bleu_against_updates_and_minutes(tmp_path):
    import learning_curve

    points = [{"label": "A", "step": 600, "train_minutes": 7.2, "test": {"bleu": 12.4}},
              {"label": "A", "step": 1200, "train_minutes": 14.4, "test": {"bleu": 26.2}},
              {"label": "B", "step": 600, "test": {"bleu": 18.2}}]  # measured before minutes were kept
    for x in ("updates", "minutes"):
        learning_curve.plot(points, tmp_path / f"{x}.png", x=x)
        assert (tmp_path / f"{x}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_busy_machine_measures_decoding_idle_and_beside_a_spinning_process(trained, tmp_path):
    import busy_machine

    model, data = trained
    records = busy_machine.main(["--model", str(model), "--data", str(data), "--out", str(tmp_path), "--work",
                                 "decode", "--settings", "one,auto", "--max-sentences", "6", "--warmup", "1",
                                 "--beam", "2"])
    assert [(r["work"], r["setting"], r["machine_state"]) for r in records] == [
        ("decode", "one", "idle"), ("decode", "one", "1 competing"), ("decode", "auto", "idle"),
        ("decode", "auto", "1 competing")]
    for record in records:
        assert record["sentences"] == 6 and record["throughput"] == record["sent_s"] > 0
    assert records[0]["threads_used"] == records[1]["threads_used"] == 1
    cores = len(os.sched_getaffinity(0))
    assert 1 <= records[3]["threads_used"] <= max(1, cores - 1)  # the spinner's core left to it
    assert records[1]["busy_over_idle"] == round(records[1]["sent_s"] / records[0]["sent_s"], 3)
    assert records[2]["idle_over_baseline"] == round(records[2]["sent_s"] / records[0]["sent_s"], 3)
    table = (tmp_path / "busy_machine.md").read_text(encoding="utf-8")
    assert table.startswith("## Training and decoding on a busy machine") and "| decode | auto |" in table
