"""Steps that take seconds report progress at INFO on the "moe_core" loggers, and stay quiet otherwise."""

from __future__ import annotations

import logging

import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, int4_w4a16, unquantized
from moe_core._progress import LoggedProgress
from moe_core.weights import load_layer
from moe_core.weights.writers import unquantized_tensors, write_model_dir

CFG = MoEConfig(8, 2, 64, 32)


def test_random_weights_report_each_expert_step_at_info(caplog, monkeypatch):
    monkeypatch.setattr(LoggedProgress, "__init__", _every_call(LoggedProgress.__init__))
    with caplog.at_level(logging.INFO, logger="moe_core"):
        ExpertWeights.random(CFG, int4_w4a16(32))
    lines = [r.getMessage() for r in caplog.records if r.name == "moe_core.weights.canonical"]
    assert lines[0].startswith("drawing random int4_w4a16_g32 weights of 8 experts: 1/8 (")
    assert [line.split(": ")[-1].split(" ")[0] for line in lines] == [f"{e}/8" for e in range(1, 9)]


def test_progress_lines_are_throttled_but_the_first_and_last_always_come(caplog):
    progress = LoggedProgress(logging.getLogger("moe_core.test"), "work", interval=3600)
    with caplog.at_level(logging.INFO, logger="moe_core"):
        for done in range(1, 101):
            progress(done, 100)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["work: 1/100", "work: 100/100"]


def test_loading_weights_reports_the_conversion(caplog):
    layer = FusedMoE(CFG, int4_w4a16(32), "cpu", prefer="reference")
    weights = ExpertWeights.random(CFG, layer.quant, progress=lambda done, total: None)
    with caplog.at_level(logging.INFO, logger="moe_core"):
        layer.load_weights(weights)
    messages = [r.getMessage() for r in caplog.records if r.name == "moe_core.layer"]
    assert messages[0] == ("converting 8 experts' int4[static-group32-bf16] weights to canonical for "
                           "ReferenceExperts ...")
    assert messages[1].startswith(messages[0].removesuffix(" ...") + ": done in ")


def test_reading_a_checkpoint_layer_reports_the_step(caplog, tmp_path):
    weights = ExpertWeights.random(MoEConfig(4, 2, 16, 8), unquantized(), progress=lambda done, total: None)
    write_model_dir(tmp_path, unquantized_tensors(weights, "model.layers.0.mlp.experts", "proj"),
                    {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2})
    with caplog.at_level(logging.INFO, logger="moe_core"):
        load_layer(tmp_path, 0)
    messages = [r.getMessage() for r in caplog.records if r.name == "moe_core.weights.checkpoint"]
    assert messages[0] == f"reading MoE layer 0 from {tmp_path} ..."
    assert messages[1].startswith(f"reading MoE layer 0 from {tmp_path}: done in ")


def test_nothing_is_logged_unless_info_is_enabled(caplog):
    with caplog.at_level(logging.WARNING, logger="moe_core"):
        layer = FusedMoE(CFG, None, "cpu", prefer="reference")
        layer.load_weights(ExpertWeights.random(CFG, layer.quant))
        layer(torch.randn(2, 64).bfloat16(), torch.randn(2, 8))
    assert not caplog.records


def _every_call(init):
    def patched(self, logger, label, interval=3.0):
        init(self, logger, label, interval=0.0)
    return patched
