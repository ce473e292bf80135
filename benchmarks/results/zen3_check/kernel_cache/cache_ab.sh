#!/usr/bin/env bash
# oneDNN/ideep kernel cache entries for float32 decoding on the Zen 3: 32 (nmtkit's bound) vs 8, alternated
W=/work/q/qs-zen3; R=/work/main/benchmarks/results/zen3_check/kernel_cache; mkdir -p $R
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="32 8"; else order="8 32"; fi
  for c in $order; do
    echo "$(date +%T) round $r cache $c load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/load.log
    (cd /work/main && ONEDNN_PRIMITIVE_CACHE_CAPACITY=$c LRU_CACHE_CAPACITY=$c python benchmarks/decode_speed.py --model $W/train/averaged --data $W/prepared --threads 2 --forced-len 0 --configs torch:float32:4,torch:float32:1 --out $R/r${r}_c$c > $R/r${r}_c$c.log 2>&1)
  done
done
