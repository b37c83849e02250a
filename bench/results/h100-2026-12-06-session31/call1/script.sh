# Session 31, call 1: `bash call.sh bash bench/results/session31/call1/script.sh` with .whl carried
# (call.sh: SUMMARY.md).
# 1. the sampling GPU tests, with test_top_p_over_runs_of_equal_tokens, which has not run yet;
# 2. (the weight stream probe, bench/probe_bulk_stream.py, left out: device time)
# 3. the BULK decode kernel (the tile moved by the TMA unit): its GPU tests, then its tune on the
#    issue's two shapes beside the register path's entries;
# 4. decode attention splits at few CTAs (the new rule: one key tile a slice while every CTA has an SM).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_sampling_gpu.py > $OUT/samptest.log 2>&1; echo samptest rc $?; tail -2 $OUT/samptest.log
timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/cuda/test_weight_only_gemm_gpu.py -k "b2r1 or b3r2" > $OUT/bulktest.log 2>&1; echo bulktest rc $?; tail -3 $OUT/bulktest.log
timeout 90 python3 bench/bench_wq_gemm.py --out /tmp/wq --tune --tune-only v2 --tune-filter 'v2_rt1_f0_s[12]_(pf0_h0_w(4|16)_u[12]|b.*)' > $OUT/wqtune.log 2>&1; echo tune rc $?
cp /tmp/wq/wq_tune.txt $OUT/ 2>/dev/null; grep -E "tune |^ +v2" $OUT/wqtune.log | awk '/tune /{print; n=0; next} {n++; if (n<=6) print}'
timeout 50 python3 bench/bench_paged_attention.py --out /tmp/pa.json --contexts 256 --batches 1 --block-sizes 16 --sweep-at "256:1;256:2;256:4;1024:1" --sweep-splits 0,1,2,4,8,16 --sweep-stages 2 > $OUT/pa.log 2>&1; echo pa rc $?
grep -iE "split|sweep" $OUT/pa.log | head -40
