"""The routing kernel and its launcher (`_kernel`), behind `moe_triton.routing`."""
