import time, resource, wdsr, torch, sys
ds = wdsr.SRDataset('bench/out/stream-qoi', scale=4, patch_size=192, patches_per_image=16, batch_size=16, shuffle_buffer=256)
loader = wdsr.make_loader(ds, num_workers=2, pin_memory=False)
n=0; t0=None
for e in range(6):
    ds.set_epoch(e)
    for b in loader:
        n+=1
        if n==4: t0=time.perf_counter(); r0=resource.getrusage(resource.RUSAGE_SELF)
dt=time.perf_counter()-t0; r1=resource.getrusage(resource.RUSAGE_SELF)
cpu=(r1.ru_utime-r0.ru_utime)+(r1.ru_stime-r0.ru_stime)
print('patches/s',(n-4)*16/dt,'main cpu %',100*cpu/dt, 'user',r1.ru_utime-r0.ru_utime,'sys',r1.ru_stime-r0.ru_stime, torch.multiprocessing.get_sharing_strategy())
