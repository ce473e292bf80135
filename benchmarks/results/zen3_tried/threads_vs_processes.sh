#!/usr/bin/env bash
# Two search threads in one process (translate's default on 2 cores: --threads 2, batches side by
# side) against two processes of one thread each, every process translating alternate lines of
# the test set, both launched at once. Both sides include one `import torch` per process (in B the
# two run at once, one per core). Rounds alternate A and B; outputs are compared line by line.
#   bash benchmarks/results/zen3_tried/threads_vs_processes.sh W [ROUNDS]
set -euo pipefail
W=$1; ROUNDS=${2:-3}
T=$W/prepared/test.en; M=$W/train/averaged
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
awk 'NR%2==1' "$T" > "$tmp/odd.en"; awk 'NR%2==0' "$T" > "$tmp/even.en"
now() { date +%s.%N; }
for r in $(seq "$ROUNDS"); do
  echo "round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
  s=$(now); nmtkit -q translate -m "$M" -i "$T" -o "$tmp/a.out" --threads 2; e=$(now)
  echo "  A one process, 2 threads (batches side by side): $(echo "$e - $s" | bc) s"
  echo "  load $(cut -d' ' -f1-3 /proc/loadavg)"
  s=$(now)
  nmtkit -q translate -m "$M" -i "$tmp/odd.en" -o "$tmp/b1.out" --threads 1 --workers 1 &
  nmtkit -q translate -m "$M" -i "$tmp/even.en" -o "$tmp/b2.out" --threads 1 --workers 1
  wait; e=$(now)
  echo "  B two processes, 1 thread each: $(echo "$e - $s" | bc) s"
  paste -d'\n' "$tmp/b1.out" "$tmp/b2.out" | head -n "$(wc -l < "$T")" > "$tmp/b.out"
  echo "  lines that differ between A and B: $(paste "$tmp/a.out" "$tmp/b.out" | awk -F'\t' '$1 != $2' | wc -l) of $(wc -l < "$T")"
done
