# Session 32, call 3 (the H200 still warm after call 2; `bash call.sh bash -c '...'`, .whl carried):
# the bfloat16 engine beside the 4-bit one in one run, for issue 10's 2.5x point.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head" --batches 1 > $OUT/e2e.log 2>&1; echo e2e rc $?
grep -E "TPOT|started" $OUT/e2e.log
