# translate's --batch-tokens on the whole test set, 2 threads (two batches side by side, the
# default), each run its own process, two rounds; wall seconds and peak RSS (GNU time's %M, KiB)
# and a digest of each output. Run from the repository root: bash benchmarks/results/zen3_ceiling/batch_tokens_cli.sh W
# (W: the quickstart's workdir). Writes benchmarks/results/zen3_ceiling/batch_tokens_cli.txt
W=${1:?the quickstart workdir}
out=benchmarks/results/zen3_ceiling/batch_tokens_cli.txt
scratch=$(mktemp -d)
{
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  for round in 1 2; do for budget in 6000 8000 24000 12000; do
    /usr/bin/time -f "round $round budget $budget: wall %e s, peak RSS %M KiB" nmtkit -q translate -m "$W/train/averaged" \
      -i "$W/prepared/test.en" -o "$scratch/$round-$budget.txt" --batch-tokens $budget --threads 2 2>&1 | tail -1
    echo "  output digest $(md5sum < "$scratch/$round-$budget.txt" | cut -c1-12)"
  done; done
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out"
rm -r "$scratch"
