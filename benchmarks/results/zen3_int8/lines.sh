#!/usr/bin/env bash
# Does a line's translation depend on the lines batched with it? The first 300 test verses,
# beam 4, translated batched and one line per batch (--batch-tokens 1), per dtype; old = 725fc90.
set -u
M=/work/q/qs-zen3/train/averaged; R=/work/main/benchmarks/results/zen3_int8/lines
mkdir -p $R && head -300 /work/q/qs-zen3/prepared/test.en > $R/first300.en
uptime >> $R/load.log
for tree in old:/work/q/old725 new:/work/main; do
  name=${tree%%:*}; dir=${tree#*:}
  for dtype in float32 int8; do
    for how in batched alone; do
      extra=""; [ $how = alone ] && extra="--batch-tokens 1"
      (cd $dir && PYTHONPATH=$dir python3 -m nmtkit -q translate -m $M -i $R/first300.en -o $R/$name.$dtype.$how \
         --dtype $dtype --threads 2 --beam-size 4 $extra)
    done
    echo "$name $dtype: $(paste -d'\t' $R/$name.$dtype.batched $R/$name.$dtype.alone | awk -F'\t' '$1 != $2' | wc -l) of 300 lines change alone vs batched" | tee -a $R/summary.txt
  done
done
uptime >> $R/load.log
rm $R/first300.en $R/*.batched $R/*.alone  # Bible text, and translations of it, are not committed
