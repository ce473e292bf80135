import json, hashlib, sys
d=sys.argv[1]
c=json.load(open(d+'/config.json'))
for k in sys.argv[2:]:
    sec, key = k.split('.'); c[sec].pop(key, None)
b=json.dumps(c, indent=1).encode(); open(d+'/config.json','wb').write(b)
s=json.load(open(d+'/checksums.json')); s['files']['config.json']={'size':len(b),'sha256':hashlib.sha256(b).hexdigest()}
json.dump(s, open(d+'/checksums.json','w'), indent=1)
