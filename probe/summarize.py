import json, sys, collections
def verdict(r):
    k = r["kiln"]
    if r.get("torch_passes") is False:
        return "torch_fails:" + ("ok" if k not in ("wrong", "crash") else k)
    if k == "count":
        return "extra_graphs" if r.get("kg", 0) > r.get("tg", 0) > 0 else "pass"
    return k
def load(p):
    return json.load(open(p))
files = sys.argv[1:]
tabs = [load(f) for f in files]
names = sorted(set().union(*tabs))
cats = collections.defaultdict(lambda: [collections.Counter() for _ in tabs])
for n in names:
    for i, t in enumerate(tabs):
        if n in t:
            cats[t[n]["cat"]][i][verdict(t[n])] += 1
keys = ["pass", "wrong", "error", "crash", "break", "extra_graphs", "timeout", "harness", "torch_fails:ok", "torch_fails:wrong", "torch_fails:crash"]
for c in sorted(cats):
    print(c.ljust(14), " | ".join(" ".join(f"{k}={v}" for k, v in sorted(cnt.items())) for cnt in cats[c]))
tot = [collections.Counter() for _ in tabs]
for c in cats:
    for i in range(len(tabs)):
        tot[i] += cats[c][i]
print("TOTAL".ljust(14), " | ".join(" ".join(f"{k}={v}" for k, v in sorted(cnt.items())) for cnt in tot))
for n in names:
    vs = [verdict(t[n]) if n in t else "-" for t in tabs]
    if any(v not in ("pass", "-") for v in vs):
        print("  ", n, vs, [ (t[n].get("why") or "")[:120] for t in tabs if n in t and verdict(t[n]) not in ("pass",)][:1])
