#!/usr/bin/env bash
# After review (4da7956): float32 and int8 against the code before this session (725fc90), same
# quickstart model trained on this Zen 3, alternated, three rounds.
set -u
M=/work/q/qs-zen3/train/averaged; D=/work/q/qs-zen3/prepared
R=/work/main/benchmarks/results/zen3_int8
run() {  # tree out configs
  uptime >> $R/load2.log
  (cd $1 && PYTHONPATH=$1 python3 benchmarks/decode_speed.py --model $M --data $D --forced-len 0 --threads 2 \
     --configs $3 --out $R/$2)
}
for round in 1 2 3; do
  run /work/q/wt_head head$round torch:int8:4,torch:float32:4,torch:int8:1,torch:float32:1
  run /work/q/old725 before$round torch:float32:4,torch:int8:4,torch:float32:1,torch:int8:1
done
uptime >> $R/load2.log
