# The GPU call planned for the next session (ask for the H200; run from the repository root with
# .whl carried, as `bash call.sh bash bench/results/h100-2026-12-05-session30/next-gpu-plan.sh`,
# call.sh as in SUMMARY.md):
# 1. the sampling GPU tests, with test_top_p_over_runs_of_equal_tokens, which has not run yet;
# 2. whether the temperature-only slowdown is the shared memory: 960748e's kernel and this one,
#    each launched with its dynamic shared memory (the ban bitmap, 16 KB at 128,256 tokens) and
#    without it (no row in the bench bans a token, so the bitmap is never touched); the new kernel
#    needs 32,048 bytes with it, over the 32 KB carveout, 960748e's 19,744;
# 3. the 4-bit ratio on the H200 after this session (no decode-step kernel changed: 2.31x expected).
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export TRTCORE_REQUIRE_GPU=1
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_sampling_gpu.py > $OUT/samptest.log 2>&1; echo samptest rc $?; tail -2 $OUT/samptest.log
CFG="temperature 0.8,top_p 0.9,min_p 0.05,top_k 50"
cp kernels/sampling.cu /tmp/new.cu; cp trtcore/runtime/sampling_gpu.py /tmp/sg.py
patch -s -o /tmp/old.cu kernels/sampling.cu < bench/results/h100-2026-12-05-session30/sampling-to-960748e.patch  # 960748e's kernel
for v in old new old0 new0; do
  case $v in old*) cp /tmp/old.cu kernels/sampling.cu;; new*) cp /tmp/new.cu kernels/sampling.cu;; esac
  case $v in *0) sed 's/shared_mem=4 \* (-(-self.vocab_size \/\/ 32))/shared_mem=0/' /tmp/sg.py > trtcore/runtime/sampling_gpu.py;; *) cp /tmp/sg.py trtcore/runtime/sampling_gpu.py;; esac
  timeout 40 python3 bench/bench_sampling.py --out /tmp/j$v --batches 1 --configs "$CFG" --rounds 7 --launches 30 > $OUT/bench-$v.log 2>&1; echo $v bench rc $?
done
cp /tmp/new.cu kernels/sampling.cu; cp /tmp/sg.py trtcore/runtime/sampling_gpu.py
paste $OUT/bench-old.log $OUT/bench-new.log $OUT/bench-old0.log $OUT/bench-new0.log | sed 's/ us//g' | awk -F'\t' '{n=split($1,a," "); m=split($2,b," "); k=split($3,c," "); j=split($4,d," "); printf "%-40s %9s %9s %9s %9s\n", substr($1,1,40), a[n], b[m], c[k], d[j]}'
timeout 230 python3 bench/bench_quant_e2e.py --out $OUT --variants "bfloat16,W4A16 g128 + lm_head" --batches 1 --profile 16 > $OUT/bench.log 2>&1; echo e2e rc $?
grep -E "TPOT|one step" $OUT/bench.log
