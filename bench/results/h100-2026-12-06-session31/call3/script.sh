# Session 31, call 3: whether the sampler's temperature-only slowdown (session 30) is its dynamic shared
# memory: 960748e's kernel and this one, each launched with the ban bitmap's dynamic shared memory and
# without it (no row in the bench bans a token, so the bitmap is never touched).
set -u
CFG="temperature 0.8,top_p 0.9"
cp kernels/sampling.cu /tmp/new.cu; cp trtcore/runtime/sampling_gpu.py /tmp/sg.py
patch -s -o /tmp/old.cu kernels/sampling.cu < bench/results/h100-2026-12-05-session30/sampling-to-960748e.patch
for v in old new old0 new0; do
  case $v in old*) cp /tmp/old.cu kernels/sampling.cu;; new*) cp /tmp/new.cu kernels/sampling.cu;; esac
  case $v in *0) sed 's/shared_mem=4 \* (-(-self.vocab_size \/\/ 32))/shared_mem=0/' /tmp/sg.py > trtcore/runtime/sampling_gpu.py;; *) cp /tmp/sg.py trtcore/runtime/sampling_gpu.py;; esac
  timeout 35 python3 bench/bench_sampling.py --out /tmp/j$v --batches 1 --configs "$CFG" --rounds 7 --launches 30 > $OUT/bench-$v.log 2>&1; echo $v bench rc $?
done
cp /tmp/new.cu kernels/sampling.cu; cp /tmp/sg.py trtcore/runtime/sampling_gpu.py
for v in old new old0 new0; do echo "== $v"; grep -E "temperature|top_p" $OUT/bench-$v.log | head -4; done
