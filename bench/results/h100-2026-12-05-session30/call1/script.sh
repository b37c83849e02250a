set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_sampling_gpu.py > $OUT/samptest.log 2>&1; echo samptest rc $?; tail -3 $OUT/samptest.log
timeout 45 python3 bench/bench_sampling.py --out $OUT/sampling-new > $OUT/sampling-new.log 2>&1; echo sampling-new rc $?
cp kernels/sampling.cu /tmp/sampling_new.cu; cp gpu30/sampling_old.cu kernels/sampling.cu
timeout 45 python3 bench/bench_sampling.py --out $OUT/sampling-old > $OUT/sampling-old.log 2>&1; echo sampling-old rc $?
cp /tmp/sampling_new.cu kernels/sampling.cu
paste $OUT/sampling-old.log $OUT/sampling-new.log | cut -c1-140
timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_weight_only_gemm_gpu.py > $OUT/wqtest.log 2>&1; echo wqtest rc $?; tail -3 $OUT/wqtest.log
timeout 110 python3 bench/bench_wq_gemm.py --out $OUT --tune --tune-only v2 --tune-filter 'v2_rt1_f0_s2_pf0_h0_w(4|8|16)_u[12](_e1)?' > $OUT/wqtune.log 2>&1; echo tune rc $?
grep -E "^8B" $OUT/wqtune.log | head -40
