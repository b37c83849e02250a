# bash call.sh bash g2.sh; the kernel had temporary experiment defines (not committed):
# NXP bit 1 skipped the norm weight's L1 prefetch, bit 2 the sums of squares, bit 4 the norm
# weight's loads and multiplies; NXB put __launch_bounds__(512, 2) on any kernel; NORES_PF
# skipped the residual's L1 prefetch
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 bench/bench_norm_fold.py --out $OUT --extra '[{"NXP": 1}, {"NXP": 2}, {"NXP": 4}, {"NXP": 7}, {"NXB": 1}, {"UNROLL": 2}, {"NORES_PF": 1}]' > $OUT/fold.log 2>&1
cat $OUT/fold.log | tail -80
