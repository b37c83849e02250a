# Session 32, call 1 (`bash call.sh bash bench/results/h200-2026-12-06-session32/call1/script.sh`, .whl carried; call.sh as in
# ../h100-2026-12-06-session31/SUMMARY.md). Session 31's plan (next-gpu-plan.sh there) plus a tune:
# 1. the paged-attention GPU tests (bfloat16 and FP8 pools, fused RoPE) under the few-CTA split rule;
# 2. the FP8 pool at few CTAs, the rule's counts against forced ones;
# 3. on an H200 only: the 4-bit batch-1 ratio (issue 10's 2.5x point);
# 4. the register-path decode GEMV at 1-16 warps, UNROLL 1 / 2, on the shapes the engine runs
#    (fused gate+up, fused qkv, o_proj, down, the 4-bit lm_head): is the plugin's choice the best?
# 5. bench/probe_read_stream.py: the fastest any kernel reads the GEMV's bytes (the floor under 3.2x).
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
export TRTCORE_REQUIRE_GPU=1
timeout 140 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_paged_attention.py tests/test_paged_attention_fp8.py tests/test_paged_attention_rope.py > $OUT/patest.log 2>&1; echo patest rc $?; tail -2 $OUT/patest.log
timeout 45 python3 bench/bench_paged_attention.py --out /tmp/pa.json --contexts 256 --batches 1 --block-sizes 16 --kv-fp8 --sweep-at "256:1;256:4;1024:1" --sweep-splits 0,1,2,4,8 --sweep-stages 2 > $OUT/pa.log 2>&1; echo pa rc $?
grep '^at ' $OUT/pa.log | python3 -c 'import json,sys; [print(r["context"], r["batch"], r["kv_cache"], r["forced_splits"], r["splits"], round(r["plugin_us"], 2)) for r in (json.loads(l[3:]) for l in sys.stdin)]'
timeout 50 python3 bench/probe_read_stream.py --out $OUT > $OUT/probe.log 2>&1; echo probe rc $?; cat $OUT/probe.log
tune_s=200
case "$gpu" in *H200*)
    tune_s=85
    timeout 240 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head" --batches 1 > $OUT/e2e.log 2>&1; echo e2e rc $?
    grep -E "TPOT|started" $OUT/e2e.log;;
esac
timeout $tune_s python3 bench/bench_wq_gemm.py --out /tmp/wq --shapes "8B gate+up fused,8B qkv fused,8B o_proj,8B down,8B gate_up,8B lm_head" --tune --tune-only v2 --tune-filter 'v2_rt1_f0_s2_pf0_h0_w(1|2|4|8|16)_u[12]' > $OUT/wqtune.log 2>&1; echo tune rc $?
cp /tmp/wq/wq_tune.txt $OUT/ 2>/dev/null; grep -E "tune |^ +v2" $OUT/wqtune.log | awk '/tune /{print; n=0; next} {n++; if (n<=4) print}'
