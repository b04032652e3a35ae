source .carry/s25_pre.sh
python3 .carry/s32_tail_ab.py 2>&1 | grep -v Warn | tee $OUT/tail_ab.log
