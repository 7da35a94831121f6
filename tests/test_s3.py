"""Object storage against a real S3 server on 127.0.0.1, with faults injected by a TCP proxy."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import s3fs

import wdsr
from shardmaker.cli import main as shardmaker_main
from shardmaker.format import load
from tests.faultproxy import FaultProxy
from tests.helpers import S3_BUCKET, FakeClock, build_shards, photos, save, torchrun, wait_until
from tests.s3server import ACCESS_KEY, REGION, SECRET_KEY, S3Server, free_port, s3fs_for

# Retry policies. None of them makes an assertion depend on the machine's speed:
# - FAST: a held response is given up on after 2 s of silence. Only for tests that need a stall
#   noticed quickly; their assertions allow for the extra tries a slow server may also cost.
# - AMPLE: FAST with so many tries that the faults a test injects can never exhaust one read,
#   whichever worker happens to meet them all.
# - PATIENT: a response held by the proxy stays held until the test releases it (no try times out
#   within a test), so "the first download is still in flight" is a fact, not a race.
FAST = wdsr.Retry(attempts=6, backoff_s=0.05, max_backoff_s=0.5, timeout_s=2.0)
AMPLE = wdsr.Retry(attempts=30, backoff_s=0.05, max_backoff_s=0.5, timeout_s=2.0)
PATIENT = wdsr.Retry(attempts=6, backoff_s=0.05, max_backoff_s=0.5, timeout_s=600.0)


def batches(ds: wdsr.SRDataset, workers: int = 2, epoch: int = 0, loader=None) -> list[tuple[str, str, tuple]]:
    ds.set_epoch(epoch)
    out = []
    for lr, hr, keys in loader or wdsr.make_loader(ds, num_workers=workers):
        out.append(
            (hashlib.sha256(lr.numpy().tobytes()).hexdigest(), hashlib.sha256(hr.numpy().tobytes()).hexdigest(), tuple(keys))
        )
    return out


def dataset(url: str, **kw) -> wdsr.SRDataset:
    args = dict(scale=4, patch_size=48, patches_per_image=3, batch_size=2, shuffle_buffer=8, seed=5, return_keys=True)
    return wdsr.SRDataset(url, **{**args, **kw})


@pytest.fixture()
def proxy(s3):
    p = FaultProxy(s3.port)
    yield p
    p.close()


def test_build_writes_shards_and_manifest_to_s3_and_verify_reads_them(s3, s3_photo_shards, photo_shards, capsys):
    fs = s3fs_for(s3.endpoint)
    local = load(str(photo_shards))
    remote = load(s3_photo_shards)
    assert [(s.name, s.sha256, s.offsets) for s in remote.shards] == [(s.name, s.sha256, s.offsets) for s in local.shards]
    names = {p.rsplit("/", 1)[1] for p in fs.ls(f"{S3_BUCKET}/photos")}
    assert {s.name for s in remote.shards} | {"manifest.json"} <= names
    assert not any(n.endswith(".partial") for n in names)
    assert shardmaker_main(["verify", "--deep", s3_photo_shards]) == 0
    assert shardmaker_main(["info", s3_photo_shards]) == 0
    assert "10" in capsys.readouterr().out


def test_large_shards_are_uploaded_in_parts(s3, tmp_path):
    """A shard bigger than the upload block goes up as a multipart upload (ETag "...-N")."""
    from shardmaker.builder import BuildConfig, build
    from shardmaker.builder.sample import SampleConfig
    from shardmaker.imaging.codecs import Codec

    for i, pic in enumerate(photos()):  # 4 x ~2.5 MB of QOI: one shard of > 5 MiB
        save(tmp_path / "src" / f"big{i}.png", np.ascontiguousarray(np.tile(pic, (2, 2, 1))[:1000, :1000]))
    url = f"s3://{S3_BUCKET}/multipart"
    opts = {"default_block_size": 5 * 2**20}  # the S3 minimum part size
    build(
        BuildConfig(
            hr_src=str(tmp_path / "src"),
            out=url,
            progress=False,
            sample=SampleConfig(scales=(2,), codec=Codec.QOI, storage_options=opts),
        )
    )
    m = load(url)
    assert len(m.shards) == 1 and m.shards[0].bytes > 5 * 2**20
    etag = s3fs_for(s3.endpoint).info(f"{S3_BUCKET}/multipart/{m.shards[0].name}")["ETag"].strip('"')
    assert "-" in etag, f"expected a multipart ETag, got {etag}"
    assert shardmaker_main(["verify", url]) == 0


def unexplained_retries(retries: int, proxy: FaultProxy) -> int:
    """Retries that neither an injected fault nor an error of the server itself (a 5xx, a dropped
    connection: what a busy machine can make a real server do) explains: 0 unless the client
    retries for nothing."""
    return max(0, retries - proxy.faults - proxy.server_errors)


@pytest.mark.parametrize("kw", [{}, {"read_ahead": 0}, {"fetch": "fsspec"}], ids=["read-ahead", "no-read-ahead", "fsspec-file"])
def test_streaming_from_s3_gives_the_same_batches_as_local_disk(s3_photo_shards, photo_shards, proxy, kw):
    """Through a proxy that injects nothing: a fresh connection pool (a connection an earlier test
    left idle past the server's idle timeout is retried once, rightly), and a count of what the
    server did wrong, so the assertion is "no retry without a cause", not "the server never faltered"."""
    want = batches(dataset(str(photo_shards)))
    ds = dataset(s3_photo_shards, storage_options={"endpoint_url": proxy.endpoint}, **kw)
    assert batches(ds) == want
    assert proxy.faults == 0 and unexplained_retries(ds.stats.totals()["retries"], proxy) == 0


def test_cut_stalled_and_503_reads_resume_and_lose_nothing(s3, s3_photo_shards, photo_shards, proxy):
    want = batches(dataset(str(photo_shards)))
    # AMPLE: the 10 faults may all meet one worker's read (the other worker started late): no read
    # can run out of tries, however the two workers' requests interleave
    ds = dataset(s3_photo_shards, retry=AMPLE, storage_options={"endpoint_url": proxy.endpoint})
    loader = wdsr.make_loader(ds, num_workers=2)  # its one peek at a sample goes before the faults
    proxy.cut_after(40_000, times=5)
    proxy.fail_503(times=3)
    proxy.hold(30_000, times=2)  # silent until the test ends: the client must give up and resume
    armed = proxy.pending()
    got = batches(ds, loader=loader)
    assert got == want  # same samples, same order, nothing repeated or lost
    assert proxy.pending() == 0 and proxy.faults == armed
    assert ds.stats.totals()["retries"] > 0  # counted in the loader stats (a cut may land after a response ended)


def test_resume_starts_at_the_byte_reached(s3, s3_photo_shards, proxy):
    """A read that stalls after N bytes times out; the retry asks only for the bytes after N.

    Each GET is compared with what the proxy forwarded of the one before, so a further stall that
    a slow machine adds (a try more, FAST gives up after 2 s of silence) is checked the same way
    instead of breaking a count."""
    info = load(s3_photo_shards).shards[0]
    fs = s3fs_for(proxy.endpoint)
    path = f"{S3_BUCKET}/photos/{info.name}"
    failed: list[BaseException] = []
    rf = wdsr.store.remote.RemoteFile(fs, path, "s3://" + path, FAST, on_retry=failed.append)
    proxy.hold(50_000, times=2)  # silent for as long as it takes FAST (2 s timeout) to give up and resume
    data = rf.read(0, info.bytes)
    assert hashlib.sha256(data).hexdigest() == info.sha256
    gets = proxy.exchanges
    starts = [g.range_start for g in gets]
    assert [g.fault for g in gets] == ["hold", "hold"] + [None] * (len(gets) - 2)
    assert len(starts) == 1 + len(failed) and starts[0] == 0  # one GET per failed try, no more
    assert all(isinstance(e, TimeoutError) for e in failed[:2])  # the two holds, given up on
    # 3 GETs when nothing else stalls; a try more only for a stall or an error of the server
    assert len([e for e in failed[2:] if not isinstance(e, TimeoutError)]) <= proxy.server_errors
    for g, nxt in zip(gets, starts[1:], strict=False):
        assert nxt == g.range_start + g.body  # resumed at exactly the byte the client had received
    header = 600  # the HTTP response head counts in the proxy's 50_000 bytes
    assert 50_000 - header < starts[1] < 50_000 and 100_000 - 2 * header < starts[2] < 100_000


def test_a_shard_that_keeps_failing_is_named_or_skipped_with_equal_batches(s3, s3_photo_shards, proxy):
    m = load(s3_photo_shards)
    bad = m.shards[1].name
    opts = {"endpoint_url": proxy.endpoint}
    proxy.cut_after(1000, times=10_000, match=bad.encode())
    with pytest.raises(wdsr.SampleError, match=rf"s3://{S3_BUCKET}/photos/{bad}: gave up .* after 6 tries"):
        batches(dataset(s3_photo_shards, retry=FAST, storage_options=opts), workers=0)
    ds = dataset(s3_photo_shards, retry=FAST, storage_options=opts, on_error="skip")
    got = batches(ds, workers=2)
    assert len(got) == len(wdsr.make_loader(ds, num_workers=2))
    assert ds.stats.totals()["skipped"] >= 1
    assert not any(k in set(m.shards[1].keys) for b in got for k in b[2])


def test_wrong_secret_is_a_clear_auth_error_and_secrets_never_show(s3, s3_photo_shards, caplog, capsys, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="wdsr")
    with pytest.raises(PermissionError) as exc:
        dataset(s3_photo_shards, storage_options={"key": ACCESS_KEY, "secret": "not-the-secret-123"})
    assert "access denied" in str(exc.value).lower() and "not-the-secret-123" not in str(exc.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-123")
    s3fs.S3FileSystem.clear_instance_cache()  # as in a fresh CLI process
    assert shardmaker_main(["info", s3_photo_shards]) == 2
    err = capsys.readouterr().err
    assert "access denied" in err.lower() and "not-the-secret-123" not in err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    s3fs.S3FileSystem.clear_instance_cache()
    # the right secret passed explicitly: not in repr, errors, logs or stats
    fs = s3fs_for(s3.endpoint)
    fs.copy(f"{S3_BUCKET}/photos", f"{S3_BUCKET}/photos-gap", recursive=True)
    m = load(s3_photo_shards)
    fs.rm(f"{S3_BUCKET}/photos-gap/{m.shards[0].name}")
    ds = dataset(f"s3://{S3_BUCKET}/photos-gap", storage_options={"key": ACCESS_KEY, "secret": SECRET_KEY}, retry=FAST)
    with pytest.raises(wdsr.SampleError, match="shard is missing") as err2:
        batches(ds, workers=0)
    assert m.shards[0].name in str(err2.value)
    shown = " ".join([repr(ds), repr(ds.reader), str(err2.value), caplog.text, str(ds.stats.totals())])
    assert SECRET_KEY not in shown


@pytest.mark.timeout(120)  # not a hang: a dead server fails each read in FAST's tries (each refused at once)
def test_killed_server_mid_epoch_is_a_clear_error_not_a_hang(tmp_path, photo_src):
    server = S3Server(tmp_path / "s3").start()
    try:
        server.make_bucket("dying")
        env = server.env()
        opts = {
            "key": env["AWS_ACCESS_KEY_ID"],
            "secret": env["AWS_SECRET_ACCESS_KEY"],
            "endpoint_url": server.endpoint,
            "client_kwargs": {"region_name": REGION},
        }
        url = "s3://dying/ds"
        from shardmaker.builder import BuildConfig, build
        from shardmaker.builder.sample import SampleConfig

        build(
            BuildConfig(
                hr_src=str(photo_src),
                out=url,
                progress=False,
                max_samples=2,
                sample=SampleConfig(scales=(4,), storage_options=opts),
            )
        )
        # No shuffle buffer and one batch prefetched per worker: when the first batch arrives, each
        # worker has read at most 3 of its 5 samples and waits for the loader to ask for more (the
        # DataLoader's task protocol, not timing), so reads are left for after the kill.
        ds = dataset(url, storage_options=opts, retry=FAST, read_ahead=0, shuffle_buffer=0)
        it = iter(wdsr.make_loader(ds, num_workers=2, prefetch_factor=1))
        next(it)
        server.kill()
        # the worker's SampleError reaches the trainer as a SampleError (torch re-raises it from its message)
        with pytest.raises(wdsr.SampleError, match=r"s3://dying/ds/shard-\d+\.tar: gave up reading .* after 6 tries"):
            for _ in it:
                pass
    finally:
        server.stop()


def test_a_dead_server_costs_the_policys_backoff_and_no_more():
    """What bounds the time a dead server costs a read: ``attempts`` tries, each refused at once,
    and the policy's backoff between them. On a clock of our own: the exact waits, not a wall-clock
    limit (the killed-server test above shows the loader gets there; this, how long it can take)."""

    class Refusing:  # a filesystem whose server is gone: every request refused at once
        protocol = ("gcs",)
        calls = 0

        def cat_file(self, path, start=None, end=None):
            self.calls += 1
            raise ConnectionRefusedError(111, "Connection refused")

    fs, clock = Refusing(), FakeClock()
    rf = wdsr.store.remote.RemoteFile(fs, "b/shard-000000.tar", "gs://b/shard-000000.tar", FAST, sleep=clock.sleep)
    with pytest.raises(wdsr.store.remote.ReadFailed, match=r"gave up reading bytes 0-99 after 6 tries \(last: Connection"):
        rf.read(0, 100)
    assert fs.calls == FAST.attempts and len(clock.slept) == FAST.attempts - 1
    for n, wait in enumerate(clock.slept):  # exponential backoff with jitter, capped
        base = min(FAST.max_backoff_s, FAST.backoff_s * 2**n)
        assert base / 2 <= wait <= base
    assert sum(clock.slept) <= (FAST.attempts - 1) * FAST.max_backoff_s  # 2.5 s at most with FAST, on any machine


def _fill(url: str, endpoint: str, cache: str, index: int, q, retry: wdsr.Retry = PATIENT) -> None:
    ds = dataset(url, storage_options={"endpoint_url": endpoint}, cache_dir=cache)
    info = ds.manifest.shards[index]
    path, downloaded = ds.reader.cache.fill(info, lambda write: write(bytes(_remote(ds, info, retry).read(0, info.bytes))))
    q.put((downloaded, hashlib.sha256(open(path, "rb").read()).hexdigest()))


def _remote(ds: wdsr.SRDataset, info, retry: wdsr.Retry = FAST):
    ds.reader._open_fs()
    path = f"{ds.reader._root}/{info.name}"
    return wdsr.store.remote.RemoteFile(ds.reader._fs, path, "s3://" + path, retry)


def test_cache_fills_once_then_serves_later_epochs_locally(s3, s3_photo_shards, photo_shards, proxy, tmp_path):
    cache = tmp_path / "cache"
    want = [batches(dataset(str(photo_shards)), epoch=e) for e in (0, 1)]
    ds = dataset(s3_photo_shards, storage_options={"endpoint_url": proxy.endpoint}, cache_dir=str(cache))
    assert batches(ds, epoch=0) == want[0]
    first = ds.stats.totals()
    m = load(s3_photo_shards)
    assert first["cache_misses"] == len(m.shards)
    gets = proxy.gets
    assert batches(ds, epoch=1) == want[1]
    assert proxy.gets == gets  # epoch 1 sent no GET to S3
    second = ds.stats.totals()
    assert second["cache_misses"] == first["cache_misses"] and second["cache_hits"] > first["cache_hits"]
    held = (cache / "wdsr-shard-cache").iterdir()  # the cache's own subfolder
    assert sorted(p.name.split("-", 1)[1] for p in held if p.suffix == ".tar") == sorted(s.name for s in m.shards)


def test_cache_evicts_least_recently_used_under_its_limit(s3, s3_photo_shards, photo_shards, tmp_path):
    m = load(s3_photo_shards)
    limit = sum(sorted(s.bytes for s in m.shards)[-2:]) + 1  # room for the two largest shards
    ds = dataset(s3_photo_shards, cache_dir=str(tmp_path / "c"), cache_limit=limit)
    assert batches(ds, epoch=0) == batches(dataset(str(photo_shards)), epoch=0)
    assert 0 < ds.reader.cache.used() <= limit
    assert len(ds.reader.cache.entries()) < len(m.shards)  # something was evicted to stay under it
    assert ds.stats.totals()["cache_misses"] >= len(m.shards)  # an evicted shard may be fetched again


def _make_cache_folder(base: str, rounds: int, barrier, q) -> None:
    """One of several processes making fresh shard caches at the same instant, as a node's workers
    and ranks do when they start: each makes the folder, then an entry of its own there."""
    from wdsr.store.cache import ShardCache

    refused = []
    for r in range(rounds):
        cache = ShardCache(os.path.join(base, f"round{r}"))
        barrier.wait()
        try:
            cache._ensure()
            (cache.root / f"{os.getpid()}-{r}.lock").touch()  # what a fill makes first
        except ValueError as e:
            refused.append(str(e))
    q.put(refused)


def test_a_fresh_cache_folder_made_by_many_processes_at_once_is_theirs(tmp_path):
    """No process takes the entries another made a moment after it wrote the marker for a
    stranger's files (4 processes x 150 fresh folders; before the folder lock, ~1% refused)."""
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_make_cache_folder, args=(str(tmp_path), 150, barrier, q)) for _ in range(4)]
    try:
        for p in procs:
            p.start()
        refused = [q.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    assert refused == [[], [], [], []]
    assert all((tmp_path / f"round{r}" / "wdsr-shard-cache" / ".wdsr-shard-cache").is_file() for r in range(150))


def test_a_folder_of_that_name_that_is_not_a_cache_is_refused_untouched(tmp_path):
    from wdsr.store.cache import ShardCache

    theirs = tmp_path / "wdsr-shard-cache"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not a wdsr shard cache"):
        ShardCache(tmp_path)._ensure()
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"] and (theirs / "notes.txt").read_text() == "mine"


def _lock_waiters(lock: Path) -> int:
    """How many processes are blocked on ``lock``'s flock (the kernel lists them in /proc/locks)."""
    if not lock.exists():
        return 0
    tag = f":{lock.stat().st_ino} "
    return sum(1 for ln in Path("/proc/locks").read_text().splitlines() if "->" in ln and tag in ln)


def test_cache_is_filled_by_one_process_at_a_time(s3, s3_photo_shards, proxy, tmp_path):
    """Four processes ask for the same shard at once: one download, four identical whole files."""
    m = load(s3_photo_shards)
    cache = str(tmp_path / "shared")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    name = m.shards[2].name.encode()
    # the first download stays in flight (PATIENT: no try times out however long the others take
    # to start) ...
    proxy.hold(10_000, times=1, match=name)
    procs = [ctx.Process(target=_fill, args=(s3_photo_shards, proxy.endpoint, cache, 2, q)) for _ in range(4)]
    try:
        for p in procs:
            p.start()
        lock = Path(cache) / "wdsr-shard-cache" / f"{m.shards[2].sha256[:16]}-{m.shards[2].name}.lock"
        proxy.wait_held()  # the download is held (release() lets go only of what is held by then) ...
        wait_until(lambda: _lock_waiters(lock) >= 3, f"3 processes waiting on {lock}")  # ... until the other three wait
        proxy.release()
        results: list = []

        def collected() -> bool:  # a child that died without its result fails at once, with its exit code
            while len(results) < len(procs) and not q.empty():
                results.append(q.get())
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"fill processes exited with {dead} after {len(results)} results"
            return len(results) == len(procs)

        wait_until(collected, "the 4 fill processes' results", timeout=300)
    finally:
        for p in procs:  # reaped whatever happened
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    assert sorted(d for d, _ in results) == [False, False, False, True]
    assert {h for _, h in results} == {m.shards[2].sha256}
    assert sum(n for path, n in proxy.paths.items() if path.endswith(name)) == 1  # one download


def test_a_killed_fill_leaves_no_torn_file(s3, s3_photo_shards, proxy, tmp_path):
    m = load(s3_photo_shards)
    cache = tmp_path / "c" / "wdsr-shard-cache"
    ctx = mp.get_context("spawn")
    proxy.hold(10_000, times=1, match=m.shards[0].name.encode())  # in flight until the kill (PATIENT: never given up on)
    q = ctx.Queue()  # held here until the child has it
    p = ctx.Process(target=_fill, args=(s3_photo_shards, proxy.endpoint, str(cache.parent), 0, q))
    p.start()
    try:
        proxy.wait_held(1)  # the fill has its partial file open and is reading into it
    finally:
        os.kill(p.pid, 9)
        p.join(60)
    assert list(cache.glob("*.partial")) and not list(cache.glob("*.tar"))
    proxy.clear()
    ds = dataset(s3_photo_shards, cache_dir=str(cache.parent))
    path, downloaded = ds.reader.cache.fill(m.shards[0], lambda w: w(bytes(_remote(ds, m.shards[0]).read(0, m.shards[0].bytes))))
    assert downloaded and hashlib.sha256(path.read_bytes()).hexdigest() == m.shards[0].sha256
    assert not list(cache.glob("*.partial"))


@pytest.mark.slow
def test_two_ranks_two_workers_stream_from_s3(s3, s3_photo_shards, proxy, tmp_path):
    reports = torchrun(2, s3_photo_shards, tmp_path / "w", env=s3.env(endpoint=proxy.endpoint))  # a proxy injecting nothing
    m = load(s3_photo_shards)
    all_keys = {k for s in m.shards for k in s.keys}
    assert len({r["len"] for r in reports}) == 1
    for epoch in range(2):
        assert [r["epochs"][epoch]["steps"] for r in reports] == [reports[0]["len"]] * 2
        assert {k for r in reports for k in r["epochs"][epoch]["keys"]} == all_keys
        keys = [k for r in reports for k in r["epochs"][epoch]["keys"]]
        per_sample = {k: keys.count(k) for k in all_keys}
        assert max(per_sample.values()) <= 6  # k=3 patches a sample, twice at most (wrap padding)
    assert proxy.faults == 0 and unexplained_retries(sum(r["stats"]["retries"] for r in reports), proxy) == 0


# A worker's child script: the worker opens its own S3 filesystem (fsspec drops the parent's from its
# cache, so the parent's becomes garbage there) and then the cyclic collector runs on the worker's
# event-loop thread. Where and when the collector runs is chance in a real run; here it is made certain.
_WORKER_COLLECTS = """
import gc, os, sys
import fsspec, fsspec.asyn
import wdsr

async def collect():
    gc.collect()

def open_then_collect():
    gc.disable()
    fs = fsspec.filesystem("s3")
    fsspec.asyn.sync(fs.loop, collect)
    gc.enable()

ds = wdsr.SRDataset(sys.argv[1], scale=4, patch_size=48, patches_per_image=2, batch_size=2, seed=5)
os.register_at_fork(after_in_child=open_then_collect)
print(sum(1 for _ in wdsr.make_loader(ds, num_workers=2)))
"""


def test_workers_never_close_the_parents_s3_session(s3, s3_photo_shards):
    """A forked worker inherits the parent's s3fs filesystem (the manifest was read through it), whose
    finalizer closes its aiohttp session on the parent's event loop. Run in a worker, it logged "Task
    exception was never retrieved ... attached to a different loop" (or waited a second for a loop that
    has no thread there): the worker keeps the parent's filesystems and never closes them."""
    r = subprocess.run([sys.executable, "-c", _WORKER_COLLECTS, s3_photo_shards], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and int(r.stdout) > 0, r.stderr[-3000:]
    noise = [w for w in ("never retrieved", "different loop", "Traceback") if w in r.stderr]
    assert not noise, r.stderr[-3000:]


def test_a_failed_build_leaves_no_torn_shard_and_no_open_upload(s3, tmp_path):
    """A corrupt source mid-shard: the multipart upload is aborted, never completed."""
    from shardmaker.builder import BuildConfig, build
    from shardmaker.builder.sample import SampleConfig
    from shardmaker.imaging.codecs import Codec

    for i in range(6):
        pic = photos()[i % 4]
        save(tmp_path / "src" / f"big{i}.png", np.ascontiguousarray(np.tile(pic, (2, 2, 1))[:1000, :1000]))
    good = (tmp_path / "src" / "big0.png").read_bytes()
    (tmp_path / "src" / "bad.png").write_bytes(good[: len(good) // 3])  # a valid header, truncated data
    url = f"s3://{S3_BUCKET}/torn"
    opts = {"default_block_size": 5 * 2**20}
    with pytest.raises(Exception, match="bad.png"):
        build(
            BuildConfig(
                hr_src=str(tmp_path / "src"),
                out=url,
                progress=False,
                sample=SampleConfig(scales=(2,), codec=Codec.QOI, storage_options=opts),
            )
        )
    fs = s3fs_for(s3.endpoint)
    left = [p for p in fs.find(f"{S3_BUCKET}/torn") if p.endswith(".tar") or p.endswith("manifest.json")]
    assert left == []
    uploads = fs.call_s3("list_multipart_uploads", Bucket=S3_BUCKET, Prefix="torn/").get("Uploads", [])
    assert uploads == []


def test_bench_compares_s3_with_local_and_shows_the_cache_hit_rate(s3_photo_shards, photo_shards, tmp_path, capsys):
    from wdsr.tools.cli import main as wdsr_main

    out = tmp_path / "b.json"
    rc = wdsr_main(
        [
            "bench",
            str(photo_shards),
            "--compare",
            s3_photo_shards,
            "--cache-dir",
            str(tmp_path / "c"),
            "--workers",
            "1",
            "--patch-size",
            "32",
            "--scale",
            "2",
            "-k",
            "4",
            "--batch-size",
            "4",
            "--seconds",
            "1",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0 and f"{s3_photo_shards} / {photo_shards}:" in text and "cache hits" in text
    local, remote = json.loads(out.read_text())
    assert local["patches_per_s"] > 0 and remote["patches_per_s"] > 0
    assert remote["cache_hit_rate"] > 0 and remote["first_batch_s"] > 0
    assert local["cache_hit_rate"] != local["cache_hit_rate"]  # NaN: no cache on local disk


def test_other_fsspec_filesystems_use_chunked_range_reads(photo_src, photo_shards):
    """Not S3 (here fsspec's memory filesystem, as GCS/Azure would be): chunked cat_file ranges."""
    url = "memory://wdsr-generic/photos"
    build_shards(photo_src, url, "--scale", "2,4", "--max-samples", "3")
    for kw in ({}, {"read_ahead": 0}):
        assert batches(dataset(url, **kw), workers=0) == batches(dataset(str(photo_shards)), workers=0)


def test_resume_mid_epoch_from_s3_through_faults_gives_the_local_batches(s3_photo_shards, photo_shards, proxy):
    """The loader state saved on an S3 dataset resumes exactly, through cut connections, and equals
    the local dataset's batches (the state names the dataset by its manifest, not by its URL)."""
    whole = batches(dataset(str(photo_shards)))
    loader = wdsr.make_loader(dataset(s3_photo_shards), num_workers=2)
    it = iter(loader)
    first = [next(it) for _ in range(4)]
    state = loader.state_dict()
    it.close()
    assert [(hashlib.sha256(lr.numpy().tobytes()).hexdigest(), tuple(k)) for lr, _, k in first] == [
        (a, k) for a, _, k in whole[:4]
    ]
    proxy.cut_after(3000, times=3, match=b"shard-")  # the shards' reads (the manifest and its index are read too)
    fresh = wdsr.make_loader(
        dataset(s3_photo_shards, retry=AMPLE, storage_options={"endpoint_url": proxy.endpoint}), num_workers=2
    )
    fresh.load_state_dict(state)
    rest = batches(fresh.sr_dataset, loader=fresh)
    assert rest == whole[4:]
    assert proxy.pending() == 0 and fresh.sr_dataset.stats.totals()["retries"] >= 1  # the cuts did happen


def test_a_pooled_connection_the_server_closed_is_replaced_not_retried():
    """An idle keep-alive connection the server has closed (SeaweedFS: after 120 s) is dropped
    before the next request instead of costing a failed try."""
    import select
    import socket

    from wdsr.store import remote

    srv = socket.create_server(("127.0.0.1", 0))
    try:
        port = srv.getsockname()[1]
        conn = remote._connection("http", "127.0.0.1", port, 5.0)
        conn.connect()
        peer, _ = srv.accept()
        assert remote._connection("http", "127.0.0.1", port, 5.0) is conn  # open and idle: reused
        peer.close()  # the server's idle timeout
        wait_until(lambda: bool(select.select([conn.sock], [], [], 0)[0]), "the closed connection to read as readable")
        fresh = remote._connection("http", "127.0.0.1", port, 5.0)
        assert fresh is not conn and conn.sock is None
        remote._drop_connection(fresh)
    finally:
        srv.close()


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run(
        [sys.executable, "-m", *args],
        env={**base, "AWS_EC2_METADATA_DISABLED": "true", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_dead_endpoint_exits_69_and_missing_credentials_2_in_one_line(tmp_path):
    """Every storage error class is one line, no traceback: a dead endpoint exits 69 (unavailable: a Job
    retries it within a budget), missing credentials 2 (bad input: it fails at once; 1 would be a crash).
    The endpoint is a closed port on 127.0.0.1; credentials are looked for nowhere else."""
    dead = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_MAX_ATTEMPTS": "1",
    }
    nocreds = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    cases = [
        (["shardmaker", "info", "s3://bucket/ds"], dead, "EndpointConnectionError", 69),
        (
            ["wdsr", "train", "--data", "s3://bucket/ds", "--out", str(tmp_path / "run"), "--check"],
            dead,
            "EndpointConnectionError",
            69,
        ),
        (
            ["wdsr", "train", "--data", "s3://bucket/ds", "--out", str(tmp_path / "run"), "--check"],
            nocreds,
            "NoCredentialsError",
            2,
        ),
    ]
    for args, env, what, code in cases:
        r = _cli(args, env)
        assert r.returncode == code and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr[-2000:])
        assert what in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_s3_commands_print_only_their_own_lines_with_s3_urls(s3, tmp_path, photo_src):
    """botocore's INFO lines ("Found credentials in environment variables.") are not the tool's own;
    the build summary names the manifest as the URL it was given (s3://...)."""
    r = _cli(
        [
            "shardmaker",
            "-q",
            "build",
            str(photo_src),
            f"s3://{S3_BUCKET}/urls",
            "--scale",
            "2",
            "--max-samples",
            "3",
            "--workers",
            "1",
        ],
        s3.env(),
    )
    assert r.returncode == 0, r.stderr
    assert f"wrote s3://{S3_BUCKET}/urls/manifest.json:" in r.stdout
    r = _cli(["shardmaker", "info", f"s3://{S3_BUCKET}/urls"], s3.env())
    assert r.returncode == 0 and "Found credentials" not in r.stderr + r.stdout, r.stderr


@pytest.mark.slow
def test_make_s3_dev_serves_a_bucket_until_interrupted(tmp_path):
    """``make s3-dev`` (python -m tests.s3server): the printed variables reach a working bucket; SIGINT stops it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.s3server", "--dir", str(tmp_path / "s3"), "--bucket", "try"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        env = {}
        for line in proc.stdout:
            if line.startswith("export "):
                k, _, v = line[len("export ") :].strip().partition("=")
                env[k] = v
            if "AWS_EC2_METADATA_DISABLED" in env:
                break
        assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:"), env
        fs = s3fs.S3FileSystem(
            key=env["AWS_ACCESS_KEY_ID"],
            secret=env["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=env["AWS_ENDPOINT_URL"],
            skip_instance_cache=True,
        )
        fs.pipe("try/hello.txt", b"hi")
        assert fs.cat("try/hello.txt") == b"hi"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
