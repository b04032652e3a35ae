"""Kernels of the bf16 / fp16 / fp32 expert GEMMs (`moe_triton.gemm`): the tl.dot grouped GEMM
(`_kernel`), the direct decode kernels (`_direct`) and the Hopper Gluon wgmma GEMMs (`_wgmma`)."""
