"""Canonical expert weights, the weight-processor contract, and checkpoint readers."""

from moe_core.weights.canonical import ExpertWeights, quantize_expert_tensor
from moe_core.weights.processor import PackedWeights, WeightProcessor

__all__ = ["ExpertWeights", "PackedWeights", "WeightProcessor", "quantize_expert_tensor"]
