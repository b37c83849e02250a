# Session 31, call 2: the few-CTA split rule end to end, W4A16 Llama-3-8B batch 1, with and without it.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python3 bench/bench_quant_e2e.py --out $OUT --variants "W4A16 g128 + lm_head,W4A16 g128 + lm_head, few-CTA splits off" --batches 1 > $OUT/e2e.log 2>&1; echo e2e rc $?
grep -E "TPOT|started" $OUT/e2e.log
