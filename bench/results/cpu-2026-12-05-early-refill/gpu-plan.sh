# The H200 call planned for the next session: the weight-only GEMM's GPU tests (the EARLY_REFILL
# variants included), the tune with and without EARLY_REFILL, the e2e step with it, and decode
# attention's split counts at max_seq_len 256. Run from the repository root with .whl carried, as
#   bash call.sh bash bench/results/cpu-2026-12-05-early-refill/gpu-plan.sh
# where call.sh installs the carried wheels and trtcore, then runs its arguments:
#   (python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site
#    python3 -m pip install -q --no-deps --no-build-isolation -e .) >$OUT/install.log 2>&1
#   export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRTCORE_CACHE=/tmp/trtcore-cache; "$@"
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_weight_only_gemm_gpu.py > $OUT/wqtest.log 2>&1
tail -3 $OUT/wqtest.log
timeout 110 python3 bench/bench_wq_gemm.py --out $OUT --tune --tune-only v2 --tune-filter 'v2_rt1_f0_s2_pf0_h0_w(4|8|16)_u[12](_e1)?' > $OUT/wqtune.log 2>&1
grep -E "^8B" $OUT/wqtune.log | head -30
timeout 230 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, early refill" --batches 1 --profile 16 > $OUT/bench.log 2>&1
grep -E "TPOT|one step" $OUT/bench.log
python3 bench/step_timeline.py $OUT/quant_e2e.json > $OUT/timeline.txt 2>&1
timeout 50 python3 bench/bench_paged_attention.py --out $OUT/pa.json --contexts 256 --batches 1 --block-sizes 16 --sweep-at "256:1;256:8;256:32" > $OUT/pa.log 2>&1
grep -cE "^at" $OUT/pa.log
