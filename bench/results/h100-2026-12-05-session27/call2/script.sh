set -x
nvidia-smi --query-gpu=name --format=csv
export TRTCORE_REQUIRE_GPU=1
timeout 110 python3 -m pytest -q -x -m gpu tests/cuda/test_weight_only_gemm_gpu.py -k "(split_add_norm and bfloat16 and (256 or 300)) or norm_input_swiglu or norm_x_of_v2" > $OUT/t1.log 2>&1; echo t1 rc $?; tail -15 $OUT/t1.log
timeout 400 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, norm in GEMV,W4A16 g128 + lm_head, norm in GEMV, qkv only" --batches 1 --profile 16 > $OUT/bench.log 2>&1; echo bench rc $?
grep -i "tpot\|one step\|started" $OUT/bench.log | head -30
timeout 60 python3 -m pytest -q -m gpu "tests/cuda/test_llm_gpu.py::test_quantized_paged_engine_matches_the_reference_backend" -k norm_in > $OUT/t2.log 2>&1; echo t2 rc $?; tail -4 $OUT/t2.log
