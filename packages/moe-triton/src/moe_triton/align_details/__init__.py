"""The alignment kernels and their launcher (`_kernels`), behind `moe_triton.align`."""
