set -u
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_weight_only_gemm_gpu.py -k "norm_input_off or (split and 256 and (norm_input or both)) or norm_input_swiglu or norm_x_of_v2 or (split and 512 and norm_input and 5)" > $OUT/t0.log 2>&1
tail -3 $OUT/t0.log
timeout 60 python3 bench/bench_norm_fold.py --out $OUT > $OUT/fold.log 2>&1
cat $OUT/fold.log
timeout 360 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, norm in GEMV,W4A16 g128 + lm_head, norm in GEMV, attention 4 splits" --batches 1 --profile 16 > $OUT/bench.log 2>&1
grep -E "TPOT" $OUT/bench.log
python3 bench/step_timeline.py $OUT/quant_e2e.json > $OUT/timeline.txt 2>&1; grep -E "quant_e2e|wq_gemv|k_row|step:" $OUT/timeline.txt
