set -x
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
export TRTCORE_REQUIRE_GPU=1
git log --oneline -1; git status --short | head -20
timeout 130 python3 -m pytest -q -x -m gpu tests/cuda/test_weight_only_gemm_gpu.py -k "(split_add_norm and bfloat16 and (256 or 300)) or norm_input_swiglu" > $OUT/t1.log 2>&1; echo t1 rc $?; tail -15 $OUT/t1.log
timeout 330 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head,W4A16 g128 + lm_head, norm in GEMV" --batches 1 --profile 16 > $OUT/bench.log 2>&1; echo bench rc $?
grep -i "tpot\|one step\|started" $OUT/bench.log | head -30
timeout 100 python3 -m pytest -q -m gpu "tests/cuda/test_llm_gpu.py::test_quantized_paged_engine_matches_the_reference_backend" > $OUT/t2.log 2>&1; echo t2 rc $?; tail -4 $OUT/t2.log
