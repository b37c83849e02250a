set -u
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_weight_only_gemm_gpu.py -k "norm_input or split or norm_x_of_v2" > $OUT/t0.log 2>&1
tail -3 $OUT/t0.log
timeout 70 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_weight_only_gemm_gpu.py -k "(kernel_matches_reference and (1 or 5 or 8)) or swiglu_plugin_matches or decode_warps_share or x_off_16" > $OUT/t1.log 2>&1
tail -3 $OUT/t1.log
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_llm_gpu.py -k "quantized_paged_engine and (norm_in_gemv or rope_plugin)" > $OUT/t2.log 2>&1
tail -3 $OUT/t2.log
