"""The 16-bit tuner's candidate lists and the `moe tune` command.
"""

import pytest
import torch

from moe_triton.configs import KernelConfig


def test_tuner_offers_wgmma_tiles_on_hopper_only():
    from moe_triton.tune import candidates

    for gated in (True, False):
        assert not any(t.wgmma for t in candidates(128, gated))
        assert not any(t.wgmma for t in candidates(32, gated, wgmma=True))  # the kernel takes 64 or 128 rows
        tiles = [t for t in candidates(128, gated, wgmma=True) if t.wgmma and not t.persistent]
        # 128 and 256 weight rows per program (gated: half as many output columns), N first or grouped by 8
        assert {(t.block_n * (2 if gated else 1), t.group_m) for t in tiles} == {(128, 1), (128, 8), (256, 1), (256, 8)}
        persistent = [t for t in candidates(128, gated, wgmma=True) if t.persistent]
        assert {(t.block_n * (2 if gated else 1), t.group_m, t.num_stages, t.tail) for t in persistent} == {
            (256, 1, 4, 0), (256, 4, 4, 0), (256, 8, 4, 0), (256, 8, 4, 16), (256, 8, 4, 32)}
        assert all(KernelConfig(128, t, t) for t in tiles)


def test_moe_tune_forwards_its_options(capsys):
    from moe_core import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tune", "--help"])
    assert exit_info.value.code == 0 and "--quant {none,int4,int8,mxfp4,fp8-tensor,fp8-channel,fp8-block}" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert cli.main(["tune", "--quant", "int4"]) == 2
        assert "torch sees no GPU" in capsys.readouterr().err
