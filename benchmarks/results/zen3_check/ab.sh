#!/usr/bin/env bash
# Zen 3 check: 41cc47c (issue 37 filed) against main, float32 (auto on this CPU), alternated.
set -u
W=/work/q/qs-zen3
R=/work/main/benchmarks/results/zen3_check
mkdir -p $R
log() { echo "$(date +%T) $* load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $R/load.log; }
tree() { if [ "$1" = old ]; then echo /work/q/old; else echo /work/main; fi; }
model() { if [ "$1" = old ]; then echo /work/q/oldmodel; else echo $W/train/averaged; fi; }
data() { if [ "$1" = old ]; then echo /work/q/oldprep/prepared; else echo $W/prepared; fi; }
recipe() { if [ "$1" = old ]; then echo /work/q/z3/old_recipe.yaml; else echo $W/train/config.yaml; fi; }
train() { log "train $1 round $2"; (cd $(tree $1) && python benchmarks/train_speed.py --recipe $(recipe $1) --model $(model $1) --data $(data $1) --dtypes float32 --steps 40 --threads 2 --out $R/r$2/$1_train > $R/r$2/$1_train.log 2>&1); }
decode() {
  log "decode $1 round $2"
  if [ $1 = old ]; then C=torch:float32:4,torch:float32:1; else C=torch:float32:4,torch:float32:1,torch:float32:4:w1,torch:float32:1:w1; fi
  (cd $(tree $1) && python benchmarks/decode_speed.py --model $(model $1) --data $(data $1) --threads 2 --forced-len 0 --configs $C --out $R/r$2/$1_decode > $R/r$2/$1_decode.log 2>&1)
  if [ $1 = new ]; then log "decode new unpacked round $2"; (cd /work/main && NMTKIT_PREPACK=0 python benchmarks/decode_speed.py --model $W/train/averaged --data $W/prepared --threads 2 --forced-len 0 --configs torch:float32:4,torch:float32:1 --out $R/r$2/new_unpacked_decode > $R/r$2/new_unpacked_decode.log 2>&1); fi
}
startup() { log "startup $1 round $2"; (cd $(tree $1) && python benchmarks/startup.py --model $(model $1) --data $(data $1) --threads 0 --out $R/r$2/$1_startup > $R/r$2/$1_startup.log 2>&1); }
for r in 1 2; do
  mkdir -p $R/r$r
  if [ $r = 1 ]; then A=old B=new; else A=new B=old; fi
  train $A $r; train $B $r
  decode $A $r; decode $B $r
done
log "ct2"
(cd /work/main && python benchmarks/decode_speed.py --model $W/train/averaged --data $W/prepared --threads 2 --forced-len 0 \
  --configs ct2direct:float32:4,ct2direct:int8:4,ct2direct:float32:4:w2,ct2direct:int8:4:w2,ct2direct:float32:1:w2,ct2direct:int8:1:w2 --out $R/ct2 > $R/ct2.log 2>&1)
for r in 1 2; do if [ $r = 1 ]; then A=old B=new; else A=new B=old; fi; startup $A $r; startup $B $r; done
log "busy"
(cd /work/main && python benchmarks/busy_machine.py --work decode --dtype float32 --settings auto,all,one --model $W/train/averaged --data $W/prepared --out $R/busy > $R/busy.log 2>&1)
log done
