#!/usr/bin/env bash
# A second round of opus.sh in the other order (now, then before), to see CTranslate2's spread.
set -u
R=/work/main/benchmarks/results/zen3_int8/opus
for tree in now:/work/q/wt_head before:/work/q/old725; do
  name=${tree%%:*}; dir=${tree#*:}
  echo "$(date -u +%H:%M:%S) $name $(git -C $dir rev-parse --short HEAD) $(uptime)" >> $R/load.log
  (cd $dir && PYTHONPATH=$dir python3 benchmarks/opus_mt_speed.py --sentences 200 --threads 2) > $R/${name}2.jsonl 2> $R/${name}2.err
done
echo "$(date -u +%H:%M:%S) end $(uptime)" >> $R/load.log
