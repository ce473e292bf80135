#!/usr/bin/env bash
# more alternated float32 training rounds, old (41cc47c) vs new (main), on the noisy Zen 3
set -u
W=/work/q/qs-zen3
R=/work/main/benchmarks/results/zen3_check
log() { echo "$(date +%T) $* load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $R/load.log; }
for r in 3 4 5 6; do
  mkdir -p $R/r$r
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for t in $order; do
    log "train $t round $r"
    if [ $t = old ]; then (cd /work/q/old && python benchmarks/train_speed.py --recipe /work/q/z3/old_recipe.yaml --model /work/q/oldmodel --data /work/q/oldprep/prepared --dtypes float32 --steps 40 --threads 2 --out $R/r$r/old_train > $R/r$r/old_train.log 2>&1)
    else (cd /work/main && python benchmarks/train_speed.py --recipe $W/train/config.yaml --model $W/train/averaged --data $W/prepared --dtypes float32 --steps 40 --threads 2 --out $R/r$r/new_train > $R/r$r/new_train.log 2>&1); fi
  done
done
log done
