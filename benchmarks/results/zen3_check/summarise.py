import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + '/**/*.json', recursive=True)):
    d = json.load(open(f))
    for r in d.get('records', []):
        keys = [k for k in ('config','toolkit','dtype','sent_s','tgt_tok_s','tgt_tok_s_min','tgt_tok_s_max','mfu_pct','bleu','peak_rss_mib','median_s','min_s','what','load_before') if k in r]
        print(f.split('zen3_check/')[-1], ' '.join(f"{k}={r[k]}" for k in keys))
