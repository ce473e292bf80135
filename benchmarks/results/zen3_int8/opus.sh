#!/usr/bin/env bash
# The OPUS-MT-size model (random MarianMT, d 512, 6+6 layers, 58k pieces), 200 sentences forced
# to 20 pieces, beam 4, 2 threads: the code before this session (per-batch int8) and now.
set -u
R=/work/main/benchmarks/results/zen3_int8/opus
mkdir -p $R
for tree in before:/work/q/old725 now:/work/q/wt_head; do
  name=${tree%%:*}; dir=${tree#*:}
  uptime >> $R/load.log
  (cd $dir && PYTHONPATH=$dir python3 benchmarks/opus_mt_speed.py --sentences 200 --threads 2) > $R/$name.jsonl 2> $R/$name.err
done
uptime >> $R/load.log
