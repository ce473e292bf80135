"""Medians and ranges per code version and configuration over the rounds of ab2.sh:
python summarise.py DIR PREFIX... (e.g. . head before)."""
import glob, json, re, statistics, sys
from collections import defaultdict

folder, prefixes = sys.argv[1], sys.argv[2:]
runs = defaultdict(list)
for path in sorted(glob.glob(f"{folder}/*/decode_speed.json")):
    name = path.split("/")[-2]
    version = re.sub(r"_?\d+$", "", name)
    if prefixes and version not in prefixes:
        continue
    for r in json.load(open(path))["records"]:
        runs[(version, r["config"])].append(r)
print("| version | config | rounds | sent/s median | range | BLEU | peak RSS MiB |")
print("|---|---|---|---|---|---|---|")
for (version, config), rs in sorted(runs.items()):
    speeds = [r["sent_s"] for r in rs]
    print(f"| {version} | {config} | {len(rs)} | {statistics.median(speeds):.1f} | {min(speeds):.1f}-{max(speeds):.1f} "
          f"| {'/'.join(sorted({str(r['bleu']) for r in rs}))} | {min(r['peak_rss_mib'] for r in rs):.0f}-{max(r['peak_rss_mib'] for r in rs):.0f} |")
