set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
CFG="top_k 50,top_p 0.9,top_k 50 + top_p 0.9,temperature 0.8,min_p 0.05,greedy"
cp kernels/sampling.cu /tmp/sampling_new.cu
cp gpu30/sampling_old.cu kernels/sampling.cu
timeout 40 python3 bench/bench_sampling.py --out $OUT/old --batches 1 --configs "$CFG" --rounds 3 --launches 20 > $OUT/bench-old.log 2>&1; echo old rc $?
for m in 0 1 2 3; do
  sed "s/^#define HIST_MODE [0-9]$/#define HIST_MODE $m/" /tmp/sampling_new.cu > kernels/sampling.cu
  timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_sampling_gpu.py -k "kernel_equals or large_vocabulary or graph or seeded" > $OUT/test-$m.log 2>&1; echo mode $m test rc $?; tail -1 $OUT/test-$m.log
  timeout 40 python3 bench/bench_sampling.py --out $OUT/m$m --batches 1 --configs "$CFG" --rounds 3 --launches 20 > $OUT/bench-$m.log 2>&1; echo mode $m bench rc $?
done
paste $OUT/bench-old.log $OUT/bench-0.log $OUT/bench-1.log $OUT/bench-2.log $OUT/bench-3.log | sed 's/batch   1  //g; s/ us//g' | awk -F'\t' '{printf "%-28s", substr($1,1,28); for(i=1;i<=NF;i++){n=split($i,a," "); printf " %9s", a[n]} print ""}'
cp /tmp/sampling_new.cu kernels/sampling.cu
