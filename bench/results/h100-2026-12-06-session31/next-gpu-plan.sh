# The GPU call planned for the next session (ask for the H200; run from the repository root with
# .whl carried, as `bash call.sh bash bench/results/h100-2026-12-06-session31/next-gpu-plan.sh`,
# call.sh as in SUMMARY.md; about 7 minutes):
# 1. the paged-attention GPU tests (bfloat16 and FP8 pools, fused RoPE) under the few-CTA split rule
#    of 3bb203b, which ran only through the benchmark's SDPA check;
# 2. the FP8 pool at few CTAs, the rule's counts against the forced ones (not timed yet);
# 3. the 4-bit batch-1 ratio on the H200 with the rule (issue 10's 2.5x point; 2.31x in session 26,
#    about 2.34x expected), and the rule's own gain there (", few-CTA splits off").
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_paged_attention.py tests/test_paged_attention_fp8.py tests/test_paged_attention_rope.py > $OUT/patest.log 2>&1; echo patest rc $?; tail -2 $OUT/patest.log
timeout 60 python3 bench/bench_paged_attention.py --out /tmp/pa.json --contexts 256 --batches 1 --block-sizes 16 --kv-fp8 --sweep-at "256:1;256:4;1024:1" --sweep-splits 0,1,2,4,8 --sweep-stages 2 > $OUT/pa.log 2>&1; echo pa rc $?
grep '^at ' $OUT/pa.log | python3 -c 'import json,sys; [print(r["context"], r["batch"], r["kv_cache"], r["forced_splits"], r["splits"], round(r["plugin_us"], 2)) for r in (json.loads(l[3:]) for l in sys.stdin)]'
timeout 330 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, few-CTA splits off" --batches 1 > $OUT/e2e.log 2>&1; echo e2e rc $?
grep -E "TPOT|started" $OUT/e2e.log
