"""The pipeline stages alone, each against a property: shuffle, augment, patches, handoff, env."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import photos
from wdsr import env
from wdsr.errors import SampleError
from wdsr.pipeline.augment import N_DIHEDRAL, dihedral_view, to_chw
from wdsr.pipeline.handoff import BatchPool, is_slot
from wdsr.pipeline.patches import Patch, PatchConfig, cut_patches
from wdsr.pipeline.shuffle import shuffled
from wdsr.pipeline.whole import DecodedPair


# ---- shuffle ----------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 300), size=st.integers(0, 64), seed=st.integers(0, 2**32 - 1))
def test_shuffle_is_a_permutation_that_never_lets_an_item_out_early(n, size, seed):
    out = list(shuffled(range(n), size, np.random.default_rng(seed)))
    assert sorted(out) == list(range(n))  # every item exactly once
    pos = {item: i for i, item in enumerate(out)}
    for i in range(n):  # an item can leave only after it entered: at most size - 1 places early
        assert pos[i] >= i - size + 1 if size > 1 else pos[i] == i
    assert out == list(shuffled(range(n), size, np.random.default_rng(seed)))  # seeded: the same order again


def test_shuffle_mixes_within_its_window():
    n, size = 2000, 64
    out = np.array(list(shuffled(range(n), size, np.random.default_rng(0))))
    displacement = np.abs(out - np.arange(n))
    assert displacement.mean() > size / 4  # mixed ...
    assert np.mean(displacement > 20 * size) < 0.01  # ... but locally: the buffer is a window, not a global shuffle


# ---- augment ----------------------------------------------------------------------------------------
def _asym(h: int = 5, w: int = 7, c: int | None = 3) -> np.ndarray:
    shape = (h, w) if c is None else (h, w, c)
    return np.arange(np.prod(shape), dtype=np.int64).reshape(shape)


def _which(a: np.ndarray, v: np.ndarray) -> int:
    hits = [t for t in range(N_DIHEDRAL) if dihedral_view(a, t).shape == v.shape and (dihedral_view(a, t) == v).all()]
    assert len(hits) == 1
    return hits[0]


def test_the_eight_transforms_are_distinct_and_form_a_group():
    a = _asym(6, 6)
    views = [dihedral_view(a, t) for t in range(N_DIHEDRAL)]
    assert len({v.tobytes() for v in views}) == N_DIHEDRAL
    assert (views[0] == a).all()
    for t1 in range(N_DIHEDRAL):
        inverses = 0
        for t2 in range(N_DIHEDRAL):
            composed = dihedral_view(dihedral_view(a, t1), t2)
            t3 = _which(a, composed)  # closure: the composition is one of the eight
            inverses += t3 == 0
        assert inverses == 1  # each has exactly one inverse
    with pytest.raises(ValueError):
        dihedral_view(a, 8)


@pytest.mark.parametrize("t", range(N_DIHEDRAL))
@pytest.mark.parametrize("s", [2, 3, 4])
def test_transforms_keep_hr_and_lr_aligned(t, s):
    lr = _asym(4, 6)
    hr = np.kron(lr, np.ones((s, s, 1), dtype=lr.dtype))  # nearest upscale: HR[s*y + i, s*x + j] = LR[y, x]
    assert (dihedral_view(hr, t) == np.kron(dihedral_view(lr, t), np.ones((s, s, 1), dtype=lr.dtype))).all()


def test_to_chw_is_a_contiguous_channel_first_copy():
    a = dihedral_view(_asym(4, 6), 5)
    c = to_chw(a)
    assert c.flags.c_contiguous and c.shape == (3, a.shape[0], a.shape[1]) and (c == a.transpose(2, 0, 1)).all()
    g = to_chw(_asym(4, 6, None))
    assert g.shape == (1, 4, 6)
    assert not np.shares_memory(c, a)


# ---- patches ----------------------------------------------------------------------------------------
def _pair(s: int, key: str = "k") -> DecodedPair:
    lr = np.ascontiguousarray(photos()[0][::8, ::8][:40, :48])
    hr = np.kron(lr, np.ones((s, s, 1), dtype=np.uint8))
    return DecodedPair("shard-000000.tar", key, 0, hr, lr, 0, 0)


@pytest.mark.parametrize("s", [2, 4])
def test_patches_are_aligned_and_do_not_depend_on_how_they_are_asked_for(s):
    spec = PatchConfig(s, 8 * s)
    pair = _pair(s)
    all5, _ = cut_patches(pair, spec, seed=3, epoch=1, first=0, count=5)
    for p in all5:
        assert p.lr.shape == (3, 8, 8) and p.hr.shape == (3, 8 * s, 8 * s)
        assert (p.hr == np.kron(p.lr, np.ones((1, s, s), dtype=np.uint8))).all()  # HR patch = s x its LR patch
    later, _ = cut_patches(pair, spec, seed=3, epoch=1, first=2, count=3)
    assert [p.lr.tobytes() for p in later] == [p.lr.tobytes() for p in all5[2:]]  # patch j is patch j, however cut
    other_epoch, _ = cut_patches(pair, spec, seed=3, epoch=2, first=0, count=5)
    assert [p.lr.tobytes() for p in other_epoch] != [p.lr.tobytes() for p in all5]


def test_patch_spec_and_small_images_are_refused_clearly():
    with pytest.raises(ValueError, match="multiple of scale"):
        PatchConfig(4, 30)
    with pytest.raises(SampleError, match="smaller than the LR patch"):
        cut_patches(_pair(2), PatchConfig(2, 2 * 64), 0, 0, 0, 1)


def test_flat_patches_are_rejected_when_asked():
    pair = _pair(2)
    pair.lr[:, :24] = 0  # a black border over half the image
    pair.hr[:, :48] = 0
    plain, _ = cut_patches(pair, PatchConfig(2, 16, augment=False), 0, 0, 0, 64)
    picky, rejected = cut_patches(pair, PatchConfig(2, 16, augment=False, min_patch_std=5.0, max_tries=20), 0, 0, 0, 64)
    flat = lambda ps: sum(float(p.lr.std()) < 5.0 for p in ps)  # noqa: E731
    assert flat(plain) > 10 and flat(picky) < flat(plain) and rejected > 0


# ---- handoff ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_batch_pool_round_trips_and_recycles_its_slots(dtype):
    rng = np.random.default_rng(0)
    top = np.iinfo(dtype).max
    lr = [rng.integers(0, top, (3, 4, 4), dtype=dtype) for _ in range(2)]
    hr = [rng.integers(0, top, (3, 8, 8), dtype=dtype) for _ in range(2)]
    nbytes = sum(a.nbytes for a in lr + hr)
    pool = BatchPool(workers=2, slots=2, slot_bytes=nbytes)

    class _Pool:  # arrays in, as patches: planar sources, transform 0 (a plain copy into the slot)
        @staticmethod
        def put(worker, lrs, hrs, keys):
            return pool.put_patches(worker, [Patch(a, b, 0, True, "k", 0) for a, b in zip(lrs, hrs, strict=True)], keys)

    metas = [_Pool.put(1, lr, hr, None) for _ in range(2)]
    assert all(is_slot(m) for m in metas)
    assert _Pool.put(1, lr, hr, None) is None  # both of worker 1's slots are busy
    assert _Pool.put(0, lr, hr, ["a", "b"]) is not None  # worker 0 has its own
    got_lr, got_hr = pool.take(metas[0], pin=False)
    as_np = got_lr.numpy() if dtype == np.uint8 else got_lr.view(torch.int16).numpy().view(np.uint16)
    assert as_np.dtype == dtype and (as_np == np.stack(lr)).all()
    assert got_hr.shape == (2, 3, 8, 8)
    assert _Pool.put(1, lr, hr, None) is None  # unpinned, the slot is lent with the tensors
    view = got_hr[1]
    del got_lr, got_hr, as_np
    assert _Pool.put(1, lr, hr, None) is None  # a view of the batch still holds it
    del view
    assert _Pool.put(1, lr, hr, None) is not None  # the slot taken is free again once all of it is gone
    wide = [np.concatenate([a, a], axis=2) for a in hr]  # twice the bytes of a slot's HR rows
    assert _Pool.put(1, lr, wide, None) is None  # does not fit: the caller falls back to torch's path
    with pytest.raises(RuntimeError, match="another loader"):
        BatchPool(2, 2, nbytes).take(metas[1], pin=False)


@pytest.mark.parametrize("planar", [False, True])
def test_a_run_of_patches_is_each_patch_cut_on_its_own(planar):
    """cut_patches' loop over a run is cut() patch by patch: the same crops and transforms."""
    from wdsr.pipeline.patches import draw_base
    from wdsr.pipeline.whole import cut

    pair = _pair(4)
    if planar:
        hr, lr = (np.ascontiguousarray(a.transpose(2, 0, 1)) for a in (pair.hr, pair.lr))
        pair = DecodedPair(pair.shard, pair.key, 0, hr, lr, 0, 0, chw=True)
    spec = PatchConfig(4, 32)
    run, _ = cut_patches(pair, spec, seed=5, epoch=2, first=3, count=40)
    base = draw_base(5, 2, pair.key)
    alone = [cut(pair, spec, base, j)[0] for j in range(3, 43)]
    assert [(p.j, p.t) for p in run] == [(p.j, p.t) for p in alone]
    assert all((a.lr == b.lr).all() and (a.hr == b.hr).all() for a, b in zip(run, alone, strict=True))
    assert len({p.t for p in run}) == N_DIHEDRAL


def test_patches_write_straight_into_a_slot_as_their_own_copies_and_a_mixed_batch_is_refused():
    """A batch slot holds exactly what each patch's ``lr``/``hr`` copy holds, for cut-from-decode
    (H x W x C) and decoded-cache (planar) pairs alike; a patch of another shape is refused with
    the slot freed again."""
    from wdsr.pipeline.batch import collate

    rng = np.random.default_rng(5)
    hr = rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)
    lr = hr[::2, ::2].copy()
    spec = PatchConfig(2, 16)
    hwc, _ = cut_patches(DecodedPair("s", "a", 0, hr, lr, 0, 0), spec, 1, 0, 0, 8)
    hr_p, lr_p = (np.ascontiguousarray(a.transpose(2, 0, 1)) for a in (hr, lr))
    planar_pair = DecodedPair("s", "a", 0, hr_p, lr_p, 0, 0, chw=True)
    planar, _ = cut_patches(planar_pair, spec, 1, 0, 0, 8)
    assert len({p.t for p in hwc}) > 2  # several transforms in the batch
    patches = hwc + planar
    want_lr, want_hr = np.stack([p.lr for p in patches]), np.stack([p.hr for p in patches])
    assert (want_lr[:8] == want_lr[8:]).all() and (want_hr[:8] == want_hr[8:]).all()  # the layout changes nothing
    pool = BatchPool(workers=1, slots=1, slot_bytes=want_lr.nbytes + want_hr.nbytes)
    ref = pool.put_patches(0, patches, None)
    got_lr, got_hr = pool.take(ref, pin=False)
    assert (got_lr.numpy() == want_lr).all() and (got_hr.numpy() == want_hr).all()
    del got_lr, got_hr  # the lent slot comes back
    lr_c, hr_c = collate(patches)
    assert (lr_c.numpy() == want_lr).all() and (hr_c.numpy() == want_hr).all()
    gray, _ = cut_patches(DecodedPair("s", "g", 0, hr[..., 0].copy(), lr[..., 0].copy(), 0, 0), spec, 1, 0, 0, 1)
    with pytest.raises(ValueError, match="patches of one batch differ"):
        pool.put_patches(0, patches[:-1] + gray, None)
    assert pool.put_patches(0, patches, None) is not None  # the slot was freed after the refusal
    with pytest.raises(ValueError, match="patches of one batch differ"):
        collate(patches[:-1] + gray)


# ---- env --------------------------------------------------------------------------------------------
def test_world_comes_from_the_environment_it_is_given():
    assert env.current_world({}) == env.World(0, 1)
    assert env.current_world({"RANK": "3", "WORLD_SIZE": "4"}) == env.World(3, 4)
    with pytest.raises(ValueError, match="not integers"):
        env.current_world({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="not in a world"):
        env.current_world({"RANK": "2", "WORLD_SIZE": "2"})
    assert env.local_rank({"LOCAL_RANK": "5"}) == 5 and env.local_rank({}) == 0
    with pytest.raises(ValueError):
        env.local_rank({"LOCAL_RANK": "gpu0"})
    assert env.current_worker() == (0, 1)  # outside a DataLoader worker


@pytest.mark.parametrize("kernels", ["cv2", "numpy"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("channels", [3, 1, 4, None])  # 4: numpy's way even with cv2
def test_patch_chw_is_the_numpy_reference_for_every_transform_and_layout(dtype, channels, kernels, monkeypatch):
    """The fast patch copy (torch flips/transposes, planar or H x W x C input) against the plain
    numpy definition: rot90 over (H, W), flip W, then C x H x W."""
    from wdsr.pipeline import augment
    from wdsr.pipeline.augment import patch_chw

    if kernels == "numpy":  # the path without OpenCV
        monkeypatch.setattr(augment, "_cv2", None)
    else:
        assert augment._cv2 is not None

    rng = np.random.default_rng(7)
    shape = (60, 50) if channels is None else (60, 50, channels)
    big = rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
    view = big[5:45, 7:37]  # a crop: strided, like every patch
    planar = np.ascontiguousarray(big[None] if channels is None else big.transpose(2, 0, 1))[:, 5:45, 7:37]
    seen = set()
    for t in range(N_DIHEDRAL):
        ref = to_chw(np.rot90(view, t % 4, axes=(0, 1))[:, ::-1] if t >= 4 else np.rot90(view, t % 4, axes=(0, 1)))
        for got in (patch_chw(view, t), patch_chw(planar, t, planar=True)):
            assert got.dtype == dtype and got.flags.c_contiguous and got.shape == ref.shape and np.array_equal(got, ref), t
        seen.add(ref.tobytes())
    assert len(seen) == N_DIHEDRAL
    with pytest.raises(ValueError):
        patch_chw(view, 8)


def test_patch_draws_are_uniform_independent_of_the_run_and_cover_every_transform():
    from wdsr.pipeline.patches import draw_base, draws

    base = draw_base(3, 1, "frames/a")
    js = np.arange(20000)
    d = draws(base, js, 0, (37, 101, N_DIHEDRAL))
    assert d[:, 0].max() == 36 and d[:, 1].max() == 100 and d[:, 0].min() == d[:, 1].min() == 0
    counts = np.bincount(d[:, 2].astype(int), minlength=N_DIHEDRAL)
    assert counts.min() > 20000 / N_DIHEDRAL * 0.9 and counts.max() < 20000 / N_DIHEDRAL * 1.1
    assert abs(np.corrcoef(d[:-1, 0].astype(float), d[1:, 0].astype(float))[0, 1]) < 0.05  # neighbours unrelated
    # patch j is the same whether it is drawn alone or in a run, and depends on seed, epoch, key, try
    assert np.array_equal(draws(base, js[123:124], 0, (37, 101, 8))[0], d[123])
    others = [
        draws(draw_base(4, 1, "frames/a"), js, 0, (37, 101, 8)),
        draws(draw_base(3, 2, "frames/a"), js, 0, (37, 101, 8)),
        draws(draw_base(3, 1, "frames/b"), js, 0, (37, 101, 8)),
        draws(base, js, 1, (37, 101, 8)),
    ]
    assert all((o != d).any(axis=1).mean() > 0.9 for o in others)
