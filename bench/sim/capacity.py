# A-priori capacity of each stage for the conversation trace under the A800 profile
# (no simulation): prefill node-seconds per request with the trace's prefix reuse (global,
# unlimited cache: an upper bound on reuse), decode capacity per node under a TBT SLO.
# Usage: python3 bench/sim/capacity.py TRACE
import json, sys
c1=2*70.6e9/(8*312e12*0.4); c0=10e-3; c2=2*8192*80/(8*312e12*0.4)
d0=70.6e9*2/(8*2.039e12*0.6); d1=c1; d2=327680/(8*2.039e12*0.6)
xfer=327680/80e9
reqs=[json.loads(l) for l in open(sys.argv[1])]
TTFT_SLO=30.0
seen=set(); pw=0; pw_nore=0; pw_ok=0; n_bad=0
for r in reqs:
    L=r['input_length']; h=r['hash_ids']; k=0
    while k<len(h) and h[k] in seen: k+=1
    P=min(k*512,L); seen.update(h)
    t=c0+c1*(L-P)+c2*(L*L-P*P); pw+=t; pw_nore+=c0+c1*L+c2*L*L
    if t>TTFT_SLO: n_bad+=1  # cannot meet the TTFT SLO even on an idle node
    else: pw_ok+=t
span=(reqs[-1]['timestamp']-reqs[0]['timestamp'])/1000
n=len(reqs); Lm=sum(r['input_length'] for r in reqs)/n; Om=sum(r['output_length'] for r in reqs)/n
print(f"n {n} span {span:.0f}s rate {n/span:.2f}/s  L {Lm:.0f} O {Om:.0f}")
print(f"prefill s/request: {pw/n:.3f} (no reuse {pw_nore/n:.3f})")
print(f"{n_bad} requests need more than {TTFT_SLO:.0f} s of prefill alone (always rejected)")
for speed in (1,2):
    lam=n/span*speed
    print(f"speed {speed}: prefill node-load {lam*pw/n:.2f} nodes, "
          f"{lam*pw_ok/n:.2f} without those")
KV=1.5e6
for slo in (0.025,0.05,0.1):
    best=None
    for N in range(1,2000):
        ctx=N*(Lm+Om/2); step=d0+d1*N+d2*ctx
        if step>slo or N*(Lm+Om)>KV: break
        best=(N,step)
    N,step=best; thr=N/(Om*step)
    print(f"TBT SLO {slo*1e3:.0f} ms: decode node holds {N} seqs, step {step*1e3:.1f} ms, "
          f"{thr:.2f} req/s per node; 2x needs {2*n/span/thr:.2f} nodes, 1x {n/span/thr:.2f}")
