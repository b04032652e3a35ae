"""Pieces of the quantized expert GEMM (`moe_triton.quant_gemm`): weight layouts (`_layouts`),
dequantization (`_dequant`), the tl.dot kernel (`_kernel`), the Hopper Gluon wgmma kernel
(`_wgmma`) and the launch heuristics and register plans (`_heuristics`)."""
