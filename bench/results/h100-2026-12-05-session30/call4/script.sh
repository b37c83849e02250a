set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_sampling_gpu.py > $OUT/samptest.log 2>&1; echo samptest rc $?; tail -2 $OUT/samptest.log
timeout 45 python3 bench/bench_sampling.py --out $OUT/new > $OUT/sampling-new.log 2>&1; echo new rc $?
cp kernels/sampling.cu /tmp/sampling_new.cu; cp gpu30/sampling_old.cu kernels/sampling.cu
timeout 45 python3 bench/bench_sampling.py --out $OUT/old > $OUT/sampling-old.log 2>&1; echo old rc $?
cp /tmp/sampling_new.cu kernels/sampling.cu
paste $OUT/sampling-old.log $OUT/sampling-new.log | sed 's/ us//g' | awk -F'\t' '{n=split($1,a," "); m=split($2,b," "); printf "%-40s %9s %9s\n", substr($1,1,40), a[n], b[m]}'
mkdir -p $OUT/json; cp $OUT/new/sampling.json $OUT/json/sampling-new.json; cp $OUT/old/sampling.json $OUT/json/sampling-old.json; rm -rf $OUT/new $OUT/old
