# Median action durations in a run's trace vs the profile's prediction at the plan's microbatch.
import json, sys, yaml, statistics, collections
prof = yaml.safe_load(open(sys.argv[1])); run = sys.argv[2]
plan = yaml.safe_load(open(run + '/plan.yaml'))
tr = json.load(open(run + '/trace.json'))
o = tr['otherData']
cuts = [tuple(map(int, c.strip('[)').split(','))) for c in o['partition'].split()]
L = prof['layers']; mb0 = prof['microbatch']
batch = 64; M = o['microbatches']; f = (batch / M) / mb0
def t(kind, a, b):
    tot = sum(l[kind] for l in L[a:b]); fx = sum(l.get(kind + '_fixed', 0) for l in L[a:b])
    return fx + (tot - fx) * f
d = collections.defaultdict(list)
for e in tr['traceEvents']:
    if e.get('ph') == 'X' and e.get('tid') == 0:
        d[(e['cat'], e['args'].get('stage'), e['pid'])].append(e['dur'] / 1e3)
print('microbatches', M, 'of', batch // M, 'partition', cuts)
for (cat, s, pid), v in sorted(d.items(), key=lambda x: (x[0][1] if x[0][1] is not None else -1, x[0][0])):
    line = f'{cat:5} stage {s} cpu:{pid}: n={len(v):5d} median {statistics.median(v):8.3f} ms  sum {sum(v)/1e3:7.2f} s'
    if cat in ('F', 'B') and s is not None:
        a, b = cuts[s]
        pred = t('forward', a, b) if cat == 'F' else t('backward', a, b)
        if cat == 'B' and any(k in str(plan) for k in ()): pass
        line += f'   profile F/B {pred*1e3:8.3f} ms (B without recompute; recompute {t("recompute", a, b)*1e3:.3f})'
    print(line)
