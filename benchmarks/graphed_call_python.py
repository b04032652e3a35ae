"""The Python of one replayed layer call, without the device: what `FusedMoE.forward` costs the host
beyond its two CUDA calls (re-pointing the graph's input copy, launching the graph).

`moe_core._graphs`' device calls are replaced by stand-ins that do nothing (the replay) or run the real
re-pointing with a driver call that does nothing (the inputs here never move), so on any machine this
times the rest: `nn.Module.__call__`, the
input checks, the lock, the signature key, the version, the liveness check and the output view. A
qwen3-30b-a3b-shaped call at one token (hidden 2048, 128 experts, top-8, bf16) on the reference
backend (its kernels never run: every call after the second is a replay). Prints the median of 20
rounds of 2000 calls, and with --profile the cProfile statistics of 20000 calls.

    uv run python benchmarks/graphed_call_python.py [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, Routing, _graph_copy, _graphs


class _Graph:
    def __init__(self, pool: object | None) -> None:
        self._pool = pool if pool is not None else object()

    def replay(self) -> None:
        pass

    def pool(self) -> object:
        return self._pool


class _NoDeviceApi:
    device_type = "cpu"
    copy_inputs = staticmethod(_graphs._CudaGraphApi.copy_inputs)

    def capturing(self) -> bool:
        return False

    def where(self, device: torch.device) -> tuple[int, int]:
        return 0, 0

    def copies_in_graph(self, statics, tensors) -> bool:
        return True

    def capture(self, work, pool, where, keep_graph) -> _Graph:
        work()
        return _Graph(pool)

    @staticmethod
    def copy_in_graph(statics, tensors) -> None:
        for static, t in zip(statics, tensors):
            static.copy_(t)

    def input_pointer(self, graph, statics):  # the real one, its driver call a no-op
        return _graph_copy.Repointer(lambda params: 0, _graph_copy._KernelNodeParams(), statics, print)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    _graphs._api = _NoDeviceApi()
    config = MoEConfig(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=64,
                       routing=Routing.softmax_topk(True), dtype=torch.bfloat16)
    layer = FusedMoE(config, prefer="reference")
    layer.load_weights(ExpertWeights.random(config, layer.quant, seed=0))
    layer._graphs = _graphs.CallGraphs(layer._run, "layer", 64, lambda t: t[0].shape[0], layer._graph_version)
    x, logits = torch.randn(1, 2048).bfloat16(), torch.randn(1, 128)
    with torch.inference_mode():
        for _ in range(3):  # eager, captured, replayed
            layer(x, logits)
        assert len(layer._graphs) == 1
        rounds = []
        for _ in range(20):
            start = time.perf_counter()
            for _ in range(2000):
                layer(x, logits)
            rounds.append((time.perf_counter() - start) / 2000 * 1e6)
        print(f"Python of one replayed layer call: {statistics.median(rounds):.2f} us")
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(20000):
                layer(x, logits)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
