# Session 32, call 2 (`bash call.sh bash bench/results/h200-2026-12-06-session32/call2/script.sh`, .whl carried):
# weight_only_gemm.DECODE_RULE (from call 1's tune): its GPU tests, the kernels' default timings,
# and the batch-1 4-bit step with the rule and without (", decode rule off"), same run.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_weight_only_gemm_gpu.py -k "decode_rule or (test_v2_decode_matches_reference and bfloat16) or test_swiglu_epilogue_of_v2" > $OUT/wqtest.log 2>&1; echo wqtest rc $?; tail -2 $OUT/wqtest.log
timeout 60 python3 bench/bench_wq_gemm.py --out $OUT --shapes "8B gate_up,8B down,8B gate+up fused,8B lm_head" > $OUT/wq.log 2>&1; echo wq rc $?; grep -E "W4A16 g128 |W8A16" $OUT/wq.log
timeout 300 python3 bench/bench_quant_e2e.py --out $OUT --variants "W4A16 g128 + lm_head,W4A16 g128 + lm_head, decode rule off" --batches 1 > $OUT/e2e.log 2>&1; echo e2e rc $?
grep -E "TPOT|started" $OUT/e2e.log
