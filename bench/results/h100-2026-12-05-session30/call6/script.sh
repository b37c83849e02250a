set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
CFG="temperature 0.8,top_p 0.9,min_p 0.05,top_k 50 + top_p 0.9"
cp kernels/sampling.cu /tmp/A.cu
for v in old A C D; do
  case $v in old) cp gpu30/sampling_old.cu kernels/sampling.cu;; A) cp /tmp/A.cu kernels/sampling.cu;; C) cp gpu30/sampling_C.cu kernels/sampling.cu;; D) cp gpu30/sampling_D.cu kernels/sampling.cu;; esac
  timeout 40 python3 bench/bench_sampling.py --out /tmp/j$v --batches 1 --configs "$CFG" --rounds 7 --launches 30 > $OUT/bench-$v.log 2>&1; echo $v bench rc $?
done
cp /tmp/A.cu kernels/sampling.cu
paste $OUT/bench-old.log $OUT/bench-A.log $OUT/bench-C.log $OUT/bench-D.log | sed 's/ us//g' | awk -F'\t' '{n=split($1,a," "); m=split($2,b," "); k=split($3,c," "); j=split($4,d," "); printf "%-40s %9s %9s %9s %9s\n", substr($1,1,40), a[n], b[m], c[k], d[j]}'
