set -x
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
export TRTCORE_REQUIRE_GPU=1
timeout 290 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, add+norm fused,W4A16 g128 + lm_head, attention unsplit" --batches 1 --profile 16 > $OUT/bench.log 2>&1; echo bench rc $?
grep -i "tpot\|one step\|sampling_step\|Memcpy" $OUT/bench.log | head -30
timeout 30 python3 bench/bench_sampling.py --out $OUT > $OUT/sampling.log 2>&1; echo sampling rc $?; tail -20 $OUT/sampling.log
timeout 80 python3 -m pytest -q -m gpu tests/cuda/test_sampling_gpu.py -k "raw_scan or stage_inputs or graph or stage_and or greedy or logprobs or nan or padding or everything" > $OUT/t0.log 2>&1; echo t0 rc $?; tail -4 $OUT/t0.log
timeout 110 python3 -m pytest -q -m gpu tests/cuda/test_device_runner_gpu.py "tests/cuda/test_llm_gpu.py::test_quantized_paged_engine_matches_the_reference_backend" > $OUT/t2.log 2>&1; echo t2 rc $?; tail -4 $OUT/t2.log
timeout 50 python3 -m pytest -q -m gpu tests/cuda/test_weight_only_gemm_gpu.py -k add_norm > $OUT/t1.log 2>&1; echo t1 rc $?; tail -3 $OUT/t1.log
