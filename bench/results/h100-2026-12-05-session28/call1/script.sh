# bash call.sh bash g1.sh (call.sh: install the carried wheels and trtcore, then run)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/t0.log
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_weight_only_gemm_gpu.py -k "norm_input_off or (split and 256 and (norm_input or both)) or norm_input_swiglu" >> $OUT/t0.log 2>&1
tail -3 $OUT/t0.log
timeout 420 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, norm in GEMV,W4A16 g128 + lm_head, norm in GEMV, attention 4 splits" --batches 1 --profile 16 > $OUT/bench.log 2>&1
grep -E "TPOT|tok/s|ratio" $OUT/bench.log | head -20
python3 bench/step_timeline.py $OUT/quant_e2e.json > $OUT/timeline.txt 2>&1; head -40 $OUT/timeline.txt
