import time, os, sys, wdsr
def cpu(pid):
    f=open(f'/proc/{pid}/stat').read().split(')')[1].split()
    return (int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK')
ds = wdsr.SRDataset('bench/out/stream-qoi', scale=4, patch_size=192, patches_per_image=16, batch_size=16, shuffle_buffer=256, verify=sys.argv[1])
loader = wdsr.make_loader(ds, num_workers=2, pin_memory=False)
n=0; t0=None
for e in range(12):
    ds.set_epoch(e)
    for b in loader:
        n+=1
        if n==6:
            pids=[w.pid for w in loader._iterator._workers]; c0=[cpu(p) for p in pids]; m0=os.times(); t0=time.perf_counter(); s0=ds.stats.totals()
dt=time.perf_counter()-t0; c1=[cpu(p) for p in pids]; m1=os.times(); s1=ds.stats.totals()
d={k:s1[k]-s0[k] for k in ('busy_ns','decode_ns','samples','patch_ns','verify_ns','read_ns')}
dec=d['decode_ns']/d['samples']/1e6; pp=d['patch_ns']/(d['samples']*16)/1e6
print(sys.argv[1],'patches/s',round((n-6)*16/dt,1),'eff',round((n-6)*16/dt/(2000/(dec/16+pp)),3),'worker cpu %',[round(100*(b-a)/dt,1) for a,b in zip(c0,c1)],
 'main cpu %', round(100*((m1.user-m0.user)+(m1.system-m0.system))/dt,1), 'busy', round(d['busy_ns']/1e9/(2*dt),3),
 'per sample ms: dec',round(dec,2),'ver',round(d['verify_ns']/d['samples']/1e6,2),'read',round(d['read_ns']/d['samples']/1e6,2),'patch',round(pp*16,2),
 'busy/sample', round(d['busy_ns']/d['samples']/1e6,2))
