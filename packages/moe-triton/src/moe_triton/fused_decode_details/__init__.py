"""The fused decode kernel (`_kernel`); `moe_triton.fused_decode` launches it."""
