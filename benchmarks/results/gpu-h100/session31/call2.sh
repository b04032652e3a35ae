source .carry/s25_pre.sh
python3 -m pytest -q -p no:cacheprovider -m device packages/moe-triton/tests/test_topk_sum.py 2>&1 | tail -3
python3 .carry/s31_cfg_ab.py 2>&1 | grep -v Warning | tee $OUT/cfg_ab.log
