# translate's --batch-tokens on the whole test set, 2 threads (two batches side by side, the
# default), each run its own process; wall seconds and peak RSS from GNU time. W: the quickstart
# model directory trained on this machine. Output: batch_tokens_cli.txt
for r in 1 2; do for b in 6000 24000 12000; do
  /usr/bin/time -f "$b wall %e s maxrss %M KB" nmtkit -q translate -m W/train/averaged -i W/prepared/test.en \
    -o /tmp/o_$b.txt --batch-tokens $b --threads 2 2>&1 | tail -1
done; done
md5sum /tmp/o_*.txt
