"""`moe_config_from_hf` against `fuse` for every served transformers MoE model type.

Each type's tiny config (test_transformers_models' `tiny_config`, with the fields a block might read
its values from set to distinct values, so reading the wrong one shows) is written to config.json
with transformers' own writer; the MoEConfig read from that file must equal the one `fuse` builds
from the model instantiated from the same config: read through the config class (transformers
installed), from the top-level and the flattened text config, and without transformers from a
config.json that spells out every field.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_transformers_models import _tiny_kwargs, instantiate, tiny_config

import moe_core.hf_config as hf_config
from moe_core.hf_config import UnsupportedModelError, load_hf_config, moe_config_from_hf
from moe_core.integrations.transformers import fuse, supported_model_types

# Values for fields that several blocks read under different names: each distinct, so a config
# attribute read in place of the one the block reads gives another MoEConfig. Set where the config
# has the attribute (expert counts stay multiples of the 4 expert groups).
DISTINCT = dict(num_local_experts=12, n_routed_experts=16, moe_num_experts=20, moe_k=3, moe_topk=4,
                routed_scaling_factor=2.5, moe_routed_scaling_factor=1.5, router_scaling_factor=3.0,
                route_scale=0.75)


def _kwargs(config) -> dict:
    kwargs = _tiny_kwargs(config)
    for name, value in DISTINCT.items():
        try:
            if getattr(config, name, None) is not None:
                kwargs[name] = value
        except Exception:
            continue
    return kwargs


def distinct_config(model_type: str):
    """`tiny_config` with DISTINCT's values."""
    return tiny_config(model_type, _kwargs)


def _fused_config(model_type: str, config):
    """The MoEConfig `fuse` builds for the model's MoE blocks (all alike in these tiny models)."""
    torch.manual_seed(0)
    report = fuse(instantiate(model_type, config).eval())
    configs = {layer.plan.config for layer in report.layers}
    assert len(configs) == 1, configs
    return configs.pop()


def _layer_fields(config) -> tuple:
    return (config.num_experts, config.top_k, config.hidden_size, config.intermediate_size, config.activation,
            config.routing, config.has_bias)


@pytest.mark.parametrize("model_type", supported_model_types())
def test_config_json_gives_the_fused_layer(model_type, tmp_path, monkeypatch):
    config = distinct_config(model_type)
    config.save_pretrained(tmp_path)  # transformers' writer: fields at their defaults are left out
    fused = _layer_fields(_fused_config(model_type, config))
    written = json.loads((tmp_path / "config.json").read_text())
    assert _layer_fields(moe_config_from_hf(written, dtype=torch.float32)) == fused
    assert _layer_fields(moe_config_from_hf(load_hf_config(tmp_path), dtype=torch.float32)) == fused
    # Without transformers: config.json's own keys, from a file that writes every field.
    full = tmp_path / "full"
    full.mkdir()
    config.to_json_file(full / "config.json", use_diff=False)
    monkeypatch.setattr(hf_config, "_config_class", lambda model_type: None)
    assert _layer_fields(moe_config_from_hf(load_hf_config(full), dtype=torch.float32)) == fused


def test_refused_and_unknown_model_types_name_the_reason():
    with pytest.raises(UnsupportedModelError, match=r"model_type='switch_transformers' is not supported: capacity"):
        moe_config_from_hf({"model_type": "switch_transformers"})
    with pytest.raises(UnsupportedModelError, match=r"model_type='no_such_model' is not supported; supported: .*mixtral"):
        moe_config_from_hf({"model_type": "no_such_model"})


def test_a_check_the_block_would_fail_refuses_the_config():
    config = distinct_config("laguna").to_dict()
    config["moe_router_logit_softcapping"] = 30.0
    with pytest.raises(UnsupportedModelError, match="soft-capping of the router logits is not supported"):
        moe_config_from_hf(config)


def test_per_layer_values_must_agree():
    config = distinct_config("hunyuan_v1_moe").to_dict()
    config["moe_topk"] = [2, 2]
    assert moe_config_from_hf(config).top_k == 2
    config["moe_topk"] = [2, 3]
    with pytest.raises(UnsupportedModelError, match=r"moe_topk=\[2, 3\] differs between layers"):
        moe_config_from_hf(config)
