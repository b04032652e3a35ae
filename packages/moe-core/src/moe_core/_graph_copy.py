"""The copy that begins a graphed call: one kernel node copying the call's inputs into the graph's
static buffers, its source addresses re-pointed before each replay by one driver call.

Why a kernel of our own: on a slow host every driver call is microseconds. A graph whose copies are
memcpy nodes needs one `cudaGraphExecMemcpyNodeSetParams1D` per input whose address moved (8.2 us for
a layer's two on the H200 host here, where the graph launch itself is 4.6); a copy launched before
the replay costs a launch per input. One kernel node copies every input of the call, and one
`cuGraphExecKernelNodeSetParams` points all of them at the call's tensors (3.9 us there). The kernel is PTX written
here (no compiler at run time beyond the driver's JIT, no Triton argument conventions to track): its
parameters are (source, destination, bytes) per input, all u64, so the node's arguments are ours to
rewrite. It copies 16 bytes per thread step where source, destination and size allow, bytes otherwise.

Only the CUDA driver library torch already loaded is used (found in /proc/self/maps); where it is not
found the caller copies the inputs in before the replay instead.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable

import torch

__all__ = ["CopyKernels", "Repointer"]

_THREADS = 256
_MAX_BLOCKS = 1024  # a grid-stride loop: more blocks than this buy nothing for the sizes graphed
_NODE_TYPE_KERNEL = 0  # CUgraphNodeType


def _ptx(count: int) -> bytes:
    """A kernel `copy_inputs(src0, dst0, bytes0, ..., src{count-1}, dst{count-1}, bytes{count-1})`."""
    params = ",\n".join(f"    .param .u64 src{k}, .param .u64 dst{k}, .param .u64 bytes{k}" for k in range(count))
    body = "".join(f"""
    ld.param.u64 %src, [src{k}];
    ld.param.u64 %dst, [dst{k}];
    ld.param.u64 %n, [bytes{k}];
    or.b64 %off, %src, %dst;
    or.b64 %off, %off, %n;
    and.b64 %off, %off, 15;
    setp.ne.u64 %bytewise, %off, 0;
    mov.u64 %i, %first;
    @%bytewise bra BYTES{k};
    shr.u64 %n, %n, 4;
VECTORS{k}:
    setp.ge.u64 %done, %i, %n;
    @%done bra DONE{k};
    shl.b64 %off, %i, 4;
    add.u64 %at, %src, %off;
    ld.global.v4.b32 {{%w0, %w1, %w2, %w3}}, [%at];
    add.u64 %at, %dst, %off;
    st.global.v4.b32 [%at], {{%w0, %w1, %w2, %w3}};
    add.u64 %i, %i, %stride;
    bra.uni VECTORS{k};
BYTES{k}:
    setp.ge.u64 %done, %i, %n;
    @%done bra DONE{k};
    add.u64 %at, %src, %i;
    ld.global.u8 %byte, [%at];
    add.u64 %at, %dst, %i;
    st.global.u8 [%at], %byte;
    add.u64 %i, %i, %stride;
    bra.uni BYTES{k};
DONE{k}:""" for k in range(count))
    return f""".version 7.0
.target sm_70
.address_size 64

.visible .entry copy_inputs(
{params})
{{
    .reg .pred %done, %bytewise;
    .reg .b32 %block, %threads, %thread, %blocks, %w<4>;
    .reg .b16 %byte;
    .reg .b64 %first, %stride, %i, %n, %src, %dst, %off, %at;
    mov.u32 %block, %ctaid.x;
    mov.u32 %threads, %ntid.x;
    mov.u32 %thread, %tid.x;
    mov.u32 %blocks, %nctaid.x;
    mul.wide.u32 %first, %block, %threads;
    cvt.u64.u32 %i, %thread;
    add.u64 %first, %first, %i;
    mul.wide.u32 %stride, %blocks, %threads;{body}
    ret;
}}
""".encode() + b"\0"


class _KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2 (v1 is its prefix up to `extra`)
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_uint), ("kernel_params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


def _load_driver() -> ctypes.CDLL | None:
    """The CUDA driver library this process already loaded (torch's), with the calls used here declared."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libcuda.so" in line}
    except OSError:
        return None
    if len(paths) != 1:
        return None
    lib = ctypes.CDLL(paths.pop())
    vp, sz, i, u = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint
    params = ctypes.POINTER(_KernelNodeParams)
    for name, args in (("cuCtxGetCurrent", [ctypes.POINTER(vp)]),
                       ("cuModuleLoadData", [ctypes.POINTER(vp), ctypes.c_char_p]),
                       ("cuModuleGetFunction", [ctypes.POINTER(vp), vp, ctypes.c_char_p]),
                       ("cuLaunchKernel", [vp, u, u, u, u, u, u, u, vp, vp, vp]),
                       ("cuGraphGetNodes", [vp, vp, ctypes.POINTER(sz)]),
                       ("cuGraphNodeGetType", [vp, ctypes.POINTER(i)]),
                       ("cuGetErrorString", [i, ctypes.POINTER(ctypes.c_char_p)])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, i
    # The v2 entry points where the driver has them (CUDA 12 and later), else the v1 ones (same prefix).
    for alias, names, args in (("get_params", ("cuGraphKernelNodeGetParams_v2", "cuGraphKernelNodeGetParams"),
                                [vp, params]),
                               ("set_params", ("cuGraphExecKernelNodeSetParams_v2", "cuGraphExecKernelNodeSetParams"),
                                [vp, vp, params])):
        fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
        if fn is None:
            return None
        fn.argtypes, fn.restype = args, i
        setattr(lib, alias, fn)
    return lib


def _check(lib: ctypes.CDLL, err: int, call: str) -> None:
    if err:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(err, ctypes.byref(text))
        raise RuntimeError(f"{call} failed: {text.value.decode() if text.value else err}")


class CopyKernels:
    """The `copy_inputs` kernels, one per (device, input count), loaded before any capture needs them."""

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | bool | None = False  # False: not looked up yet
        self._functions: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def prepare(self, device: torch.device, count: int) -> bool:
        """Load the kernel copying `count` inputs on `device` (outside any capture: loading a module is
        not a stream operation); False where the driver library or the device's context is not found."""
        with self._lock:
            if self._lib is False:
                self._lib = _load_driver()
            lib = self._lib
            if lib is None:
                return False
            key = (device.index, count)
            if key in self._functions:
                return True
            with torch.cuda.device(device.index):
                context = ctypes.c_void_p()
                _check(lib, lib.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
                if not context.value:
                    return False
                module, function = ctypes.c_void_p(), ctypes.c_void_p()
                _check(lib, lib.cuModuleLoadData(ctypes.byref(module), _ptx(count)), "cuModuleLoadData")
                _check(lib, lib.cuModuleGetFunction(ctypes.byref(function), module, b"copy_inputs"),
                       "cuModuleGetFunction")
            self._functions[key] = function.value
            return True

    def launch(self, statics: tuple[torch.Tensor, ...], tensors: tuple[torch.Tensor, ...]) -> None:
        """Copy `tensors` into `statics` on the current stream (called while capturing: the graph's node)."""
        lib = self._lib
        function = self._functions[(statics[0].device.index, len(statics))]
        arguments = _kernel_arguments(statics, tensors)  # held until the launch has copied the values
        blocks = _blocks(statics)
        stream = torch.cuda.current_stream(statics[0].device).cuda_stream
        _check(lib, lib.cuLaunchKernel(function, blocks, 1, 1, _THREADS, 1, 1, 0, stream, arguments[1], None), "cuLaunchKernel")

    def pointer(self, graph: torch.cuda.CUDAGraph,
                statics: tuple[torch.Tensor, ...]) -> Callable[[tuple[torch.Tensor, ...]], None]:
        """For a graph captured with `keep_graph` whose work began with `launch(statics, ...)`: a function
        pointing that node's sources at a call's tensors."""
        lib = self._lib
        function = self._functions[(statics[0].device.index, len(statics))]
        raw = torch.cuda.CUDAGraph.raw_cuda_graph(graph)
        count = ctypes.c_size_t(0)
        _check(lib, lib.cuGraphGetNodes(raw, None, ctypes.byref(count)), "cuGraphGetNodes")
        nodes = (ctypes.c_void_p * count.value)()
        _check(lib, lib.cuGraphGetNodes(raw, nodes, ctypes.byref(count)), "cuGraphGetNodes")
        found = []
        for node in nodes:
            kind = ctypes.c_int(-1)
            _check(lib, lib.cuGraphNodeGetType(node, ctypes.byref(kind)), "cuGraphNodeGetType")
            if kind.value != _NODE_TYPE_KERNEL:
                continue
            params = _KernelNodeParams()
            _check(lib, lib.get_params(node, ctypes.byref(params)), "cuGraphKernelNodeGetParams")
            if params.func == function:
                found.append((node, params))
        if len(found) != 1:
            raise RuntimeError(f"expected one input copy kernel in the captured graph, found {len(found)}")
        node, params = found[0]
        exec_ = torch.cuda.CUDAGraph.raw_cuda_graph_exec(graph)
        return Repointer(functools.partial(lib.set_params, exec_, node), params, statics,
                         lambda err: _check(lib, err, "cuGraphExecKernelNodeSetParams"))


def _kernel_arguments(statics: tuple[torch.Tensor, ...], tensors: tuple[torch.Tensor, ...]
                      ) -> tuple[ctypes.Array, ctypes.Array]:
    """`copy_inputs`' arguments: their values (source, destination, bytes per input, u64) and the array
    of pointers to each value that a launch or a node update takes; the values must outlive its use."""
    values = (ctypes.c_uint64 * (3 * len(statics)))(
        *[v for s, t in zip(statics, tensors) for v in (t.data_ptr(), s.data_ptr(), s.numel() * s.element_size())])
    base = ctypes.addressof(values)
    return values, (ctypes.c_void_p * len(values))(*[base + 8 * k for k in range(len(values))])


def _blocks(statics: tuple[torch.Tensor, ...]) -> int:
    widest = max(s.numel() * s.element_size() for s in statics)
    return max(1, min(_MAX_BLOCKS, -(-widest // (16 * _THREADS))))


class Repointer:
    """Gives the copy node the parameters `params` (as captured) with its sources at a call's tensors:
    one driver call when any source moved since the previous call, none otherwise (a decode loop's
    inputs often come back at the same address: the caching allocator reuses a freed block of that
    size)."""

    __slots__ = ("_args", "_by_reference", "_fail", "_params", "_set_params", "_sources", "_values")

    def __init__(self, set_params: Callable[[object], int], params: _KernelNodeParams,
                 statics: tuple[torch.Tensor, ...], fail: Callable[[int], None]) -> None:
        # The node's arguments: the driver reads them through `params` on every update, so they live here.
        self._values, self._args = _kernel_arguments(statics, statics)
        self._sources = range(0, len(self._values), 3)
        for k in self._sources:
            self._values[k] = 0  # no source yet: the first call sets them all
        params.kernel_params = ctypes.addressof(self._args)
        self._params = params
        self._by_reference = ctypes.byref(params)
        self._set_params = set_params
        self._fail = fail

    def __call__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        values, moved = self._values, False
        for k, t in zip(self._sources, tensors):
            address = t.data_ptr()
            if address != values[k]:
                values[k] = address
                moved = True
        if moved:
            err = self._set_params(self._by_reference)
            if err:
                for k in self._sources:  # not pointed: the next call tries again
                    values[k] = 0
                self._fail(err)
