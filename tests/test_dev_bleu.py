"""Dev BLEU during training is what `nmtkit translate` + `nmtkit score` give for the same
weights and dev set: validation decodes with the same Translator, not a path of its own."""
from __future__ import annotations

import json

from conftest import reversal_pairs, tiny_recipe, write_prepared
from nmtkit.config import from_dict
from nmtkit.runtime.console import get_console
from support.cli import run_cli


def test_dev_bleu_equals_translate_then_score(tmp_path):
    from nmtkit.training.trainer import train

    dev = reversal_pairs(24, 1, length=5)
    dev[5] = ("", "")  # an empty source: translate gives an empty line without running the model
    write_prepared(tmp_path, reversal_pairs(300, 0, length=5), dev)
    settings = dict(max_steps=80, log_every=40, validate_every=80, save_every=80, best_metric="bleu", dev_bleu_beam=2)
    decode = dict(beam_size=1, lenpen=1.0, max_len_a=1.5, max_len_b=3, min_len=1, batch_tokens=40)
    run_dir = train(from_dict(tiny_recipe(tmp_path, train=settings, decode=decode)), get_console(-1))
    during_training = json.loads((run_dir / "best" / "config.json").read_text())["dev_bleu"]

    prepared = tmp_path / "prepared"
    hyp = tmp_path / "dev.hyp"
    translated = run_cli("translate", "-m", str(run_dir / "best"), "-i", str(prepared / "dev.src"), "-o", str(hyp),
                         "--beam-size", "2", "--lenpen", "1.0", "--max-len-a", "1.5", "--max-len-b", "3",
                         "--batch-tokens", "40", "--device", "cpu", "--dtype", "float32")
    assert translated.returncode == 0, translated.stderr.decode()
    scored = run_cli("score", "--json", "-r", str(prepared / "dev.tgt"), "-i", str(hyp))
    assert scored.returncode == 0, scored.stderr.decode()
    bleu = json.loads(scored.stdout)["scores"]["bleu"]["score"]
    assert during_training == bleu
    assert bleu > 0  # the model translates something right: an equality of zeros would say nothing
