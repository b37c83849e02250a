set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
CFG="temperature 0.8,top_k 50,top_p 0.9,top_k 50 + top_p 0.9,min_p 0.05"
cp kernels/sampling.cu /tmp/A.cu
for v in old A B; do
  case $v in old) cp gpu30/sampling_old.cu kernels/sampling.cu;; A) cp /tmp/A.cu kernels/sampling.cu;; B) cp gpu30/sampling_B.cu kernels/sampling.cu;; esac
  timeout 40 python3 bench/bench_sampling.py --out /tmp/j$v --batches 1 --configs "$CFG" --rounds 7 --launches 30 > $OUT/bench-$v.log 2>&1; echo $v bench rc $?
done
timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_sampling_gpu.py > $OUT/test-B.log 2>&1; echo B test rc $?; tail -1 $OUT/test-B.log
cp /tmp/A.cu kernels/sampling.cu
paste $OUT/bench-old.log $OUT/bench-A.log $OUT/bench-B.log | sed 's/ us//g' | awk -F'\t' '{n=split($1,a," "); m=split($2,b," "); k=split($3,c," "); printf "%-40s %9s %9s %9s\n", substr($1,1,40), a[n], b[m], c[k]}'
