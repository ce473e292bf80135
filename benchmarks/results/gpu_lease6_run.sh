# One lease: gpu_check on the current code, then decoding old (f3f9873) vs new on one carried model.
set -u
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
PYTHONPATH=. timeout -k 20 330 python3 benchmarks/gpu_check.py --out "$OUT" --device cuda --data gpu-data/quickstart \
  --parts device,invariants,training,resume,kernels,quickstart,decode --budget-s 320 > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?"
CFG=torch:bf16:4,torch:bf16:1,torch:float32:4,torch:float32:1
for r in 1 2; do for code in new old; do
  if [ $code = new ]; then dir=$ROOT; extra="--peak-seconds 0.2"; else dir=$ROOT/gpu-data/old; extra=""; fi
  echo "== $code run $r $(date +%T)" >> "$OUT/ab.log"
  (cd $dir && PYTHONPATH=. timeout -k 5 75 python3 benchmarks/decode_speed.py --model $ROOT/gpu-data/model \
     --data $ROOT/gpu-data/quickstart/prepared --device cuda --configs $CFG --forced-len 0 $extra \
     --out /tmp/ab_${code}_$r >> "$OUT/ab.log" 2>&1); echo "$code $r rc=$?" >> "$OUT/ab.log"
  cp /tmp/ab_${code}_$r/decode_speed.json "$OUT/ab_${code}_$r.json" 2>/dev/null
done; done
echo done; tail -3 "$OUT/gpu_check.log"
