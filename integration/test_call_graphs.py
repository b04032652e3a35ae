"""`moe_core._graphs.CallGraphs`' bookkeeping on the CPU: CUDA's graph calls replaced by a stand-in
whose 'graph' runs the captured work again on replay. What a real GPU adds (the kernels recorded, the
pool) is checked by integration/test_call_path.py on a GPU; here: first sightings run eagerly,
the second call captures, later ones replay without the call's Python; outputs a caller keeps are
never overwritten (more graphs of the signature, then eager calls); a new version drops the graphs;
capture failures, large calls, grad mode and nested captures stay eager."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import subprocess
from pathlib import Path

import pytest
import torch

from moe_core import ExpertWeights, FusedMoE, MoEConfig, Routing, _graph_copy, _graphs


class _Graph:
    def __init__(self, work, pool) -> None:
        self._work = work
        self._pool = pool if pool is not None else object()

    def replay(self) -> None:
        with _graphs._graphing_call():  # a real replay runs no Python: what it recorded does no bookkeeping
            self._work()

    def pool(self) -> object:
        return self._pool


class _CpuGraphApi:
    """Graphs of CPU calls: capturing runs the work once (a real capture only records it), replaying runs it again."""

    device_type = "cpu"

    def __init__(self) -> None:
        self.captures = 0
        self.fail: Exception | None = None
        self._capturing = False

    def capturing(self) -> bool:
        return self._capturing

    def where(self, device: torch.device) -> tuple[int, int]:
        return 0, 0

    def capture(self, work, pool, where, keep_graph) -> _Graph:
        if self.fail is not None:
            raise self.fail
        self.captures += 1
        self._capturing = True
        try:
            work()
        finally:
            self._capturing = False
        return _Graph(work, pool)

    def copies_in_graph(self, statics, tensors) -> bool:
        return False  # the caller copies the inputs in (CUDA's graphs copy them themselves: a GPU test)

    copy_inputs = staticmethod(_graphs._CudaGraphApi.copy_inputs)


@pytest.fixture
def api(monkeypatch) -> _CpuGraphApi:
    stand_in = _CpuGraphApi()
    monkeypatch.setattr(_graphs, "_api", stand_in)
    return stand_in


class _Counted:
    """x [M, K], y [M, E] -> x * 2 + y's row sums; counts its eager runs (the call's Python)."""

    def __init__(self) -> None:
        self.runs = 0
        self.version = 0

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return x * 2 + y.sum(-1, keepdim=True)


def _graphs_of(fn: _Counted, max_tokens: int = 64) -> _graphs.CallGraphs:
    return _graphs.CallGraphs(fn, "test", max_tokens, lambda t: t[0].shape[0], lambda: fn.version)


def _inputs(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 8, generator=gen), torch.randn(rows, 4, generator=gen)


def _want(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y.sum(-1, keepdim=True)


def test_the_second_call_of_a_signature_captures_and_later_ones_replay(api):
    fn = _Counted()
    graphs = _graphs_of(fn)
    for seed in range(5):
        x, y = _inputs(3, seed)
        torch.testing.assert_close(graphs(x, y), _want(x, y), rtol=0, atol=0)
    assert api.captures == 1 and len(graphs) == 1
    # call 1 eager; call 2 a warm-up run, the capture and its replay; calls 3-5 replays (the stand-in's
    # replay runs the captured work again, where a CUDA graph replays its kernels without the Python)
    assert fn.runs == 1 + 3 + 3
    x, y = _inputs(5, 9)  # another signature: its own first sighting
    graphs(x, y)
    assert api.captures == 1


def test_outputs_a_caller_keeps_are_never_overwritten(api):
    fn = _Counted()
    graphs = _graphs_of(fn)
    graphs(*_inputs(2, 0))
    calls = [_inputs(2, 10 + i) for i in range(7)]
    kept = [graphs(x, y) for x, y in calls]
    for out, (x, y) in zip(kept, calls):
        torch.testing.assert_close(out, _want(x, y), rtol=0, atol=0)
    assert len(graphs) == _graphs._RING  # then eager calls, the caller holding every graph's outputs
    del kept
    out = graphs(*_inputs(2, 30))  # graphs free again: replayed, no new capture
    assert len(graphs) == _graphs._RING and api.captures == _graphs._RING
    view = out[0]  # a view of the output keeps its storage: the next call must not reuse that graph
    later = graphs(*_inputs(2, 31))
    torch.testing.assert_close(view, _want(*_inputs(2, 30))[0], rtol=0, atol=0)
    torch.testing.assert_close(later, _want(*_inputs(2, 31)), rtol=0, atol=0)


def test_graphed_calls_nested_in_a_graphed_call_run_plain(api):
    """The outer graph holds the inner call's work (a fused block and its layer): the inner one
    captures nothing while the outer graphs it, and graphs its own calls made on their own."""
    fn = _Counted()
    inner = _graphs_of(fn)
    outer = _graphs.CallGraphs(lambda x, y: inner(x, y) + 1, "outer", 64, lambda t: t[0].shape[0], lambda: 0)
    x, y = _inputs(4, seed=0)
    for _ in range(4):  # first sighting, capture (warm-up and recording), replays
        torch.testing.assert_close(outer(x, y), _want(x, y) + 1)
    assert len(outer) == 1 and len(inner) == 0
    for _ in range(3):
        torch.testing.assert_close(inner(x, y), _want(x, y))
    assert len(inner) == 1


def test_a_new_version_drops_every_graph(api):
    fn = _Counted()
    graphs = _graphs_of(fn)
    for _ in range(3):
        graphs(*_inputs(2, 0))
    assert len(graphs) == 1
    fn.version += 1  # e.g. the weights were reloaded
    graphs(*_inputs(2, 1))
    assert len(graphs) == 0  # and this call was a first sighting again
    graphs(*_inputs(2, 2))
    assert len(graphs) == 1


@pytest.mark.parametrize("rows", [0, 65])
def test_empty_and_large_calls_stay_eager(api, rows):
    fn = _Counted()
    graphs = _graphs_of(fn, max_tokens=64)
    for seed in range(3):
        x, y = _inputs(rows, seed)
        torch.testing.assert_close(graphs(x, y), _want(x, y))
    assert len(graphs) == 0 and fn.runs == 3


def test_grad_mode_and_nested_captures_stay_eager(api):
    fn = _Counted()
    graphs = _graphs_of(fn)
    x, y = _inputs(2, 0)
    x.requires_grad_(True)
    for _ in range(3):
        graphs(x, y)
    assert len(graphs) == 0
    api._capturing = True  # the caller's own capture: the call is recorded there, not graphed here
    for _ in range(3):
        graphs(*_inputs(2, 1))
    assert len(graphs) == 0


def test_a_failed_capture_is_logged_once_and_served_eagerly(api, caplog):
    fn = _Counted()
    graphs = _graphs_of(fn)
    api.fail = RuntimeError("operation not permitted when stream is capturing")
    with caplog.at_level(logging.WARNING, logger="moe_core._graphs"):
        for seed in range(4):
            x, y = _inputs(2, seed)
            torch.testing.assert_close(graphs(x, y), _want(x, y), rtol=0, atol=0)
    assert len(graphs) == 0
    assert caplog.text.count("capturing them in a CUDA graph failed") == 1


def test_a_layer_replays_its_graphs_and_drops_them_on_reload(api):
    """FusedMoE through the stand-in: graphed calls equal plain ones, before and after a reload."""
    config = MoEConfig(num_experts=8, top_k=2, hidden_size=32, intermediate_size=16, dtype=torch.float32,
                       routing=Routing.deepseek_v3(4, 2, 2.5))
    layer = FusedMoE(config, device="cpu", prefer="reference")
    plain = FusedMoE(config, device="cpu", prefer="reference")
    layer._graphed = True  # as on a GPU
    layer._init_call_state()
    gen = torch.Generator().manual_seed(0)
    for seed in (1, 2):
        weights, bias = ExpertWeights.random(config, layer.quant, seed=seed), torch.randn(8, generator=gen)
        layer.load_weights(weights, bias)
        plain.load_weights(weights, bias)
        for _ in range(3):
            x, logits = torch.randn(4, 32, generator=gen), torch.randn(4, 8, generator=gen)
            with torch.no_grad():
                torch.testing.assert_close(layer(x, logits), plain(x, logits), rtol=0, atol=0)
        assert len(layer._graphs) == 1  # the first load's graph dropped by the reload


def test_a_fused_block_replays_as_one_graph(api):
    """A fused transformers block graphed as a whole (router projection, experts, shared experts) gives
    the plain block's outputs; its layer runs plain inside it, and replays its own graphs when the
    block is compiled (the layer then being the custom op)."""
    from test_transformers_models import build_model

    from moe_core.integrations.transformers import fuse

    model = build_model("qwen2_moe", torch.float32, seed=0)  # shared experts with a gate
    fuse(model, prefer="reference")
    block = next(m for m in model.modules() if type(m).__name__ == "FusedMoEBlock")
    moe = block.moe
    moe._graphs = _graphs.CallGraphs(moe._run, "layer", 64, lambda t: t[0].shape[0], moe._graph_version)  # as on a GPU
    block._graphed = True
    block._init_graphs()
    gen = torch.Generator().manual_seed(0)
    hook_calls = []
    moe.register_forward_pre_hook(lambda module, args: hook_calls.append(args[0].shape))
    with torch.no_grad():
        x = torch.randn(1, 3, model.config.hidden_size, generator=gen)
        block(x)  # first sighting: eager, the layer called as a module (its hooks run, as parity tests need)
        assert hook_calls == [torch.Size([3, model.config.hidden_size])]
        for _ in range(4):
            x = torch.randn(1, 3, model.config.hidden_size, generator=gen)
            with _graphs._graphing_call():  # the plain block as reference, its layer's graphs left alone
                expected = block._block(x)
            torch.testing.assert_close(block(x), expected, rtol=0, atol=0)
        assert len(block._graphs) == 1
        assert len(moe._graphs) == 0  # eager: the layer runs plain inside its block's graph
        # Compiled, the block is traced and its layer is the custom op: the layer replays its own graphs.
        flat = x.reshape(-1, x.shape[-1])
        logits = block.router_logits(flat)
        for _ in range(3):
            torch.testing.assert_close(torch.ops.moe_core.fused_moe(flat, logits, moe._op_key), moe._run(flat, logits),
                                       rtol=0, atol=0)
        assert len(moe._graphs) == 1


def _node_arguments(by_reference, count: int) -> list[int]:
    """The copy node's arguments as the driver reads them through the parameters it is handed."""
    args = ctypes.cast(by_reference._obj.kernel_params, ctypes.POINTER(ctypes.c_void_p))
    return [ctypes.c_uint64.from_address(args[k]).value for k in range(3 * count)]


def test_the_input_copy_is_repointed_only_when_a_source_moved():
    """One driver call points every input's copy at the call's tensors, made only when an input's
    address changed since the previous call (and on the first call); destinations and sizes stay."""
    statics = (torch.zeros(16), torch.zeros(8, dtype=torch.bfloat16))
    calls = []

    def set_params(by_reference) -> int:
        calls.append(_node_arguments(by_reference, 2))
        return 0

    point = _graph_copy.Repointer(set_params, _graph_copy._KernelNodeParams(), statics,
                                  lambda err: pytest.fail(f"error {err}"))
    x, logits, other = torch.zeros(16), torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)

    def wanted(a, b):
        return [a.data_ptr(), statics[0].data_ptr(), 64, b.data_ptr(), statics[1].data_ptr(), 16]

    point((x, logits))
    assert calls == [wanted(x, logits)]
    point((x, logits))  # both where they were
    assert calls == [wanted(x, logits)]
    point((x, other))  # one moved: one call for the node
    assert calls == [wanted(x, logits), wanted(x, other)]
    point((x, logits))  # and back
    assert calls[-1] == wanted(x, logits) and len(calls) == 3


def test_a_failed_repoint_raises_and_is_retried_on_the_next_call():
    results = [5, 0]  # the driver's answers: an error, then success

    def fail(err: int) -> None:
        raise RuntimeError(f"driver error {err}")

    point = _graph_copy.Repointer(lambda by_reference: results.pop(0), _graph_copy._KernelNodeParams(),
                                  (torch.zeros(1),), fail)
    x = torch.zeros(1)
    with pytest.raises(RuntimeError, match="driver error 5"):
        point((x,))
    point((x,))  # the failed call did not count as pointed: the driver is called again
    assert results == []


@pytest.mark.parametrize("count", [1, 2, 3])
def test_the_input_copy_kernel_assembles_for_sm_90(count, tmp_path):
    """The copy kernel's PTX through ptxas for sm_90 (Triton's own, where Triton is installed): the
    driver JIT-compiles the same text on the GPU; what it does there is integration/test_call_path.py's."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs Triton's ptxas")
    ptxas = Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip(f"needs Triton's ptxas ({ptxas} missing)")
    source = tmp_path / "copy.ptx"
    source.write_bytes(_graph_copy._ptx(count).rstrip(b"\0"))
    done = subprocess.run([str(ptxas), "-arch=sm_90", "-v", str(source), "-o", str(tmp_path / "copy.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 bytes spill" in done.stderr and "copy_inputs" in done.stderr


def test_graphs_captured_under_inference_mode_replay_outside_it(api):
    """A layer first called under torch.inference_mode() (a warm-up, a benchmark) and then outside it
    (generate under no_grad) replays the same graph: its static inputs take the new call's values."""
    fn = _Counted()
    graphs = _graphs_of(fn)
    with torch.inference_mode():
        for seed in range(2):  # first sighting, then the capture
            graphs(*_inputs(3, seed))
    with torch.no_grad():
        x, y = _inputs(3, 7)
        torch.testing.assert_close(graphs(x, y), _want(x, y), rtol=0, atol=0)
    assert api.captures == 1 and len(graphs) == 1
