"""Bridges from model libraries to `moe_core.FusedMoE`.

Each bridge is its own module and imports its library only when imported itself, so moe-core keeps
torch as its one hard dependency: `from moe_core.integrations.transformers import fuse`.
"""
