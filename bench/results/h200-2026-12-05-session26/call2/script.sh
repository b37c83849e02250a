set -x
export TRTCORE_REQUIRE_GPU=1
timeout 40 python3 -m pytest -q -m gpu tests/cuda/test_sampling_gpu.py > $OUT/t0.log 2>&1; echo t0 rc $?; tail -3 $OUT/t0.log
timeout 60 python3 -m pytest -q -m gpu tests/cuda/test_device_runner_gpu.py > $OUT/t2.log 2>&1; echo t2 rc $?; tail -3 $OUT/t2.log
timeout 170 python3 bench/bench_quant_e2e.py --out $OUT --variants "W4A16 g128 + lm_head,W4A16 g128 + lm_head, attention unsplit" --batches 1 > $OUT/bench.log 2>&1; echo bench rc $?
grep -i "tpot" $OUT/bench.log
