"""Model keys belong to an architecture: a key the chosen architecture would ignore is an error
that says where it belongs, and a saved config (which lists every key) still loads."""
from __future__ import annotations

import dataclasses

import pytest

from nmtkit.config import ARCH_KEYS, Config, ModelConfig, from_dict, load_config, save_config
from nmtkit.errors import ConfigError

SHARED = {"arch", "encoder_layers", "decoder_layers", "dropout", "tie_embeddings"}


def test_every_model_key_is_shared_or_owned_by_one_architecture():
    owned = [key for keys in ARCH_KEYS.values() for key in keys]
    assert len(owned) == len(set(owned))
    assert sorted(set(owned) | SHARED) == sorted(f.name for f in dataclasses.fields(ModelConfig))
    assert not SHARED & set(owned)


@pytest.mark.parametrize("model, message", [
    ({"arch": "transformer", "hidden_dim": 300}, "model.hidden_dim is a setting of model.arch=rnn, but this model "
                                                 "is model.arch=transformer"),
    ({"arch": "rnn", "d_model": 256}, "model.d_model is a setting of model.arch=transformer, but this model "
                                      "is model.arch=rnn"),
    ({"arch": "rnn", "preset": "transformer-base"}, "model.preset is a setting of model.arch=transformer"),
])
def test_a_key_of_the_other_architecture_is_an_error(model, message):
    with pytest.raises(ConfigError, match=message):
        from_dict({"data": {"source": "files"}, "model": model})


def test_shared_keys_and_own_keys_pass_and_saved_configs_load_again(tmp_path):
    rnn = from_dict({"data": {"source": "files"}, "model": {"arch": "rnn", "hidden_dim": 300, "dropout": 0.3, "encoder_layers": 2}})
    assert (rnn.model.hidden_dim, rnn.model.dropout, rnn.model.width) == (300, 0.3, 300)
    save_config(rnn, tmp_path / "config.yaml")  # lists the Transformer keys too, at their defaults
    assert load_config(tmp_path / "config.yaml").to_dict() == rnn.to_dict()
    transformer = from_dict({"data": {"source": "files"}, "model": {"preset": "transformer-big"}})
    assert transformer.model.width == transformer.model.d_model == 1024
    assert Config().model.width == 512
