"""One vocabulary: the old public names still work for one release, warn, and mean the new ones."""

from __future__ import annotations

import dataclasses

import pytest

import shardmaker
from shardmaker import builder as build_mod
from shardmaker.builder import sample as sample_mod
from shardmaker.builder.sample import LrMethod, SampleConfig
from shardmaker.deprecation import WdsrDeprecationWarning
from shardmaker.errors import OnError
from shardmaker.format.manifest import LR_METHODS
from wdsr import dataset as dataset_mod
from wdsr.pipeline import patches as patches_mod
from wdsr.pipeline import read as read_mod


@pytest.mark.parametrize(
    "module, old, new",
    [
        (build_mod, "BuildOptions", build_mod.BuildConfig),
        (dataset_mod, "Options", dataset_mod.DatasetConfig),
        (read_mod, "ReadOptions", read_mod.ReadConfig),
        (patches_mod, "PatchSpec", patches_mod.PatchConfig),
        (sample_mod, "PROVIDED", LrMethod.PROVIDED),
    ],
)
def test_renamed_names_warn_and_are_the_new_ones(module, old, new):
    with pytest.warns(WdsrDeprecationWarning, match=old):
        assert getattr(module, old) is new
    with pytest.raises(AttributeError, match="no attribute"):
        module.NoSuchName  # noqa: B018


def test_verify_error_is_deprecated_but_still_catchable():
    with pytest.warns(WdsrDeprecationWarning, match="VerifyError"):
        cls = shardmaker.VerifyError
    assert issubclass(cls, shardmaker.ShardmakerError)
    assert "VerifyError" not in shardmaker.__all__


def test_skip_errors_keyword_maps_to_on_error(tmp_path):
    with pytest.warns(WdsrDeprecationWarning, match="skip_errors"):
        cfg = build_mod.BuildConfig(hr_src=str(tmp_path), out=str(tmp_path / "o"), skip_errors=True)
    assert cfg.on_error is OnError.SKIP
    assert build_mod.BuildConfig(hr_src="a", out="b", on_error="skip").on_error is OnError.SKIP
    assert dataclasses.replace(cfg, on_error=OnError.FAIL).on_error is OnError.FAIL  # InitVar does not stick


def test_one_on_error_enum_for_build_and_stream():
    assert dataset_mod.OnError is OnError is shardmaker.OnError


def test_lr_method_is_an_enum_that_matches_the_format():
    assert {m.value for m in LrMethod} == set(LR_METHODS)
    assert SampleConfig(scales=(2,), lr_method="matlab-uint8").lr_method is LrMethod.MATLAB_UINT8
    assert SampleConfig(scales=(), lr_method="provided").lr_method.resize is None
    with pytest.raises(ValueError, match="lr_method must be one of"):
        SampleConfig(scales=(2,), lr_method="bicubic")


def test_bench_stream_k_keyword_is_deprecated():
    from wdsr.tools.bench import bench_stream

    with pytest.warns(WdsrDeprecationWarning, match=r"bench_stream\(k=\.\.\.\)"), pytest.raises(Exception):  # noqa: B017
        bench_stream("/nonexistent/dataset", k=4, seconds=0.1)


@pytest.mark.parametrize(
    "old, new, name",
    [
        ("wdsr.stream", "wdsr.pipeline.stream", "TrainStream"),
        ("wdsr.remote", "wdsr.store.remote", "RemoteFile"),
        ("wdsr.trainconfig", "wdsr.train.config", "TrainConfig"),
        ("shardmaker.codecs", "shardmaker.imaging.codecs", "decode"),
        ("shardmaker._compat", "shardmaker.deprecation", "WdsrDeprecationWarning"),
        ("shardmaker.compat", "shardmaker.deprecation", "warn"),
        ("shardmaker.clikit", "shardmaker.commandline", "parse_size"),
    ],
)
def test_module_paths_of_the_flat_layout_still_import_with_a_warning(old, new, name):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(WdsrDeprecationWarning, match=rf"the module {old} .* use {new}"):
        mod = importlib.import_module(old)
    assert getattr(mod, name) is getattr(importlib.import_module(new), name)
    sys.modules.pop(old, None)


def test_shardmaker_build_is_the_function_of_the_face_not_the_old_module():
    """The old ``shardmaker.build`` module path is gone: the name is the face's ``build()``."""
    import importlib

    import shardmaker

    assert callable(shardmaker.build)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("shardmaker.build")
    assert callable(shardmaker.build)
