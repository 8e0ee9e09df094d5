# Stall reasons and opcode mix per kernel from `ncu -i REP --page source --print-source sass --csv` (stop 45).
# Usage: python3 sass_summary.py source.csv
import csv, collections, re, sys
rows=list(csv.reader(open(sys.argv[1])))
kern=[]; cur=None
for r in rows:
    if len(r)>=1 and r[0]=="Kernel Name":
        cur={'name':r[1],'hdr':None,'rows':[]}; kern.append(cur); continue
    if cur is None: continue
    if cur['hdr'] is None: cur['hdr']=r; continue
    cur['rows'].append(r)
for k in kern:
    h=k['hdr']; ix={n:i for i,n in enumerate(h)}
    stalls=[n for n in h if n.startswith('stall_') and 'Not Issued' not in n]
    tot=collections.Counter(); ops=collections.Counter(); opsamp=collections.Counter()
    totsamp=0; totinst=0
    for r in k['rows']:
        src=r[ix['Source']].strip()
        op=re.sub(r'^@!?U?P\S+\s+','',src).split(' ')[0]
        n=int(r[ix['Instructions Executed']] or 0)
        s=int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
        ops[op]+=n; opsamp[op]+=s; totsamp+=s; totinst+=n
        for st in stalls: tot[st]+=int(r[ix[st]] or 0)
    print("==", k['name'][40:110], "instr", totinst, "samples", totsamp)
    for st,v in tot.most_common(10): print("  %-28s %5.1f%%"%(st, 100*v/max(1,totsamp)))
    print("  by opcode (executed warp-instr share, sample share):")
    for op,v in ops.most_common(25): print("   %-14s %5.1f%%  %5.1f%%"%(op,100*v/totinst,100*opsamp[op]/max(1,totsamp)))
