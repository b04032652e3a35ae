"""Canonical expert weights, the weight-processor contract, and checkpoint readers."""

from moe_core.weights._source import CheckpointError
from moe_core.weights.canonical import ExpertWeights, quantize_expert_tensor
from moe_core.weights.checkpoint import LoadedLayer, load_layer
from moe_core.weights.hf import experts_from_state_dict
from moe_core.weights.processor import PackedWeights, WeightProcessor

__all__ = ["CheckpointError", "ExpertWeights", "LoadedLayer", "PackedWeights", "WeightProcessor",
           "experts_from_state_dict", "load_layer", "quantize_expert_tensor"]
