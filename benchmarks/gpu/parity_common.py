"""What the vendor-parity scripts share: calling a library operator by its arguments' names, and the
kernels one eager call launches."""

from __future__ import annotations

import torch


def call_by_schema(op, values: dict, aliases: dict[str, str] | None = None):
    """Call a library operator whose argument list changed between versions, by argument name: each
    schema argument takes `values[name]` (or `values[aliases[name]]`); an argument with a default and
    no value ends the call; one without a default and no value is an error naming the schema."""
    schema = op.default._schema
    aliases = aliases or {}
    args = []
    for arg in schema.arguments:
        name = arg.name if arg.name in values else aliases.get(arg.name)
        if name in values:
            args.append(values[name])
        elif arg.has_default_value():
            break
        else:
            raise RuntimeError(f"{schema}: no value for argument {arg.name!r}")
    return op(*args)


def kernels(fn, *inputs: torch.Tensor) -> list[tuple[str, float]]:
    """(name, us) of each kernel one eager call of `fn` runs, after one call to warm it up."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    return [(e.name[:90], round(e.device_time_total, 2)) for e in prof.events() if e.device_type == DeviceType.CUDA]
