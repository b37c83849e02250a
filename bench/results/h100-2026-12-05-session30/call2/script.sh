set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
timeout 300 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, early refill" --batches 1 --profile 16 > $OUT/bench.log 2>&1; echo bench rc $?
grep -E "TPOT|one step" $OUT/bench.log
python3 bench/step_timeline.py $OUT/quant_e2e.json > $OUT/timeline.txt 2>&1; grep -E "step:|quant_e2e" $OUT/timeline.txt
timeout 50 python3 bench/bench_paged_attention.py --out $OUT/pa.json --contexts 256 --batches 1 --block-sizes 16 --sweep-at "256:1;256:8;256:32" > $OUT/pa.log 2>&1; echo pa rc $?
grep -E "^at|split" $OUT/pa.log | head -20
