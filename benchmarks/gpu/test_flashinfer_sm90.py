"""CPU checks of flashinfer_sm90.py's source handling, on generated files written the way FlashInfer
0.7.2.post1's CUTLASS generator writes them (its two forms of explicit instantiation). No FlashInfer
needed: `pytest benchmarks/gpu/test_flashinfer_sm90.py`.
"""

from __future__ import annotations

import pytest
from flashinfer_sm90 import VARIANTS, split_instantiations, wanted

HEAD = '#include "launchers/moe_gemm_tma_ws_launcher.inl"\nnamespace tensorrt_llm\n{\nnamespace kernels\n{\n\n'
TAIL = "\n\n} // namespace kernels\n} // namespace tensorrt_llm\n"
TMA = ("#if defined(ENABLE_BF16) && defined(ENABLE_BF16)\n"
       "        INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM(Sm90, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16,\n"
       "        void, EpilogueOpDefault, NONE,\n        128, 256, 64, {cluster}, 1, 1,\n"
       "        false, false, false, true);\n#endif\n")
MIXED = ("template void sm90_generic_mixed_moe_gemm_kernelLauncher<__nv_bfloat16, SafeFP4, __nv_bfloat16,\n"
         "EpilogueOpDefault, cute::Shape<cute::Int<128>, cute::Int<{tile}>, cute::Int<512>>> (\n"
         "GroupedGemmInput<__nv_bfloat16, SafeFP4, __nv_bfloat16, __nv_bfloat16>inputs, int sm_count_);\n")


@pytest.mark.parametrize(("form", "key"), [(TMA, "cluster"), (MIXED, "tile")])
def test_each_instantiation_gets_a_file_with_the_preamble(tmp_path, form, key):
    bodies = [form.format(**{key: v}) for v in (1, 2, 4)]
    source = tmp_path / "cutlass_kernel_file_gemm_grouped_sm90_M128_group7.generated.cu"
    source.write_text(HEAD + "\n\n".join(bodies) + TAIL)
    parts = split_instantiations(source)
    assert [p.name for p in parts] == [f"cutlass_kernel_file_gemm_grouped_sm90_M128_group7_part{i}.generated.cu"
                                       for i in range(3)]
    assert [p.read_text() for p in parts] == [HEAD + body + TAIL for body in bodies]
    # the kernel types the variant filter reads survive the split
    variant = VARIANTS["bf16-fp8"] if form is TMA else VARIANTS["mxfp4"]
    assert wanted(source, variant) and all(wanted(p, variant) for p in parts)
    mtime = parts[0].stat().st_mtime_ns
    assert split_instantiations(source) == parts and parts[0].stat().st_mtime_ns == mtime  # not rewritten


def test_single_instantiation_is_left_alone_and_stray_code_refused(tmp_path):
    one = tmp_path / "one.generated.cu"
    one.write_text(HEAD + MIXED.format(tile=128) + TAIL)
    assert split_instantiations(one) == [one]
    stray = tmp_path / "stray.generated.cu"
    stray.write_text(HEAD + MIXED.format(tile=128) + "static int helper = 1;\n" + MIXED.format(tile=256) + TAIL)
    with pytest.raises(SystemExit, match="not split"):
        split_instantiations(stray)
