# As run: python scripts/predicted.py profile-3kinds-3to5bits.csv BITS [R] (from the folder above): the plan the profile's own KL figures choose at BITS (long-context
# bits, mean KL + R x spread per cell, an exact knapsack in half-bit steps) and its summed KL over the best uniform setting's.
import pandas as pd, sys
t = pd.read_csv(sys.argv[1]); budget=float(sys.argv[2]); r=float(sys.argv[3]) if len(sys.argv)>3 else 0
t["cost"]=t.kl + r*t.kl_std
L = sorted(t.layer.unique())
opts = {}
for l in L:
    k = t[(t.layer==l)&(t.tensor=="K")]; v = t[(t.layer==l)&(t.tensor=="V")]
    opts[l] = [(a.bits+b.bits, a.cost+b.cost, a.scheme, b.scheme) for a in k.itertuples() for b in v.itertuples()]
# DP over bits in 0.5 units
cap = int(round(budget*2*len(L)*2))
best = {0:(0.0,[])}
for l in L:
    nb={}
    for used,(c,ch) in best.items():
        for bits,cost,ks,vs in opts[l]:
            u=used+int(round(bits*2))
            if u>cap: continue
            if u not in nb or nb[u][0]>c+cost: nb[u]=(c+cost,ch+[(ks,vs)])
    best=nb
c,ch = min(best.values())
# uniforms
uni=[]
ks=t[t.tensor=="K"].scheme.unique(); vs=t[t.tensor=="V"].scheme.unique()
for a in ks:
  for b in vs:
    bits = t[(t.scheme==a)].bits.iloc[0]+t[(t.scheme==b)].bits.iloc[0]
    if bits/2<=budget+1e-9:
      uni.append((t[t.scheme.isin([a,b])].kl.sum(), a,b))
u=min(uni)
pk = sum(t[(t.layer==l)&(t.scheme==k)].kl.iloc[0]+t[(t.layer==l)&(t.scheme==v)].kl.iloc[0] for l,(k,v) in zip(L,ch))
print(f"plan pred {pk:.4g} uniform pred {u[0]:.4g} {u[1]}/{u[2]} ratio {pk/u[0]:.3f}")
print(ch)
