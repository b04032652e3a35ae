"""Private kernels and helpers of moe_triton; their signatures may change without notice."""
