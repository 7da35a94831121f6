"""The output folder of one build: what is there, what may be overwritten, what a rerun resumes."""

from __future__ import annotations

import json
import logging
from typing import Any

from shardmaker import storage
from shardmaker.builder import outdir
from shardmaker.builder.config import SHARD_FILE, STATE_DIR, BuildConfig, part_manifest_name, shard_name
from shardmaker.builder.sources import Skipped
from shardmaker.errors import BuildError
from shardmaker.format.manifest import MANIFEST, Manifest, ManifestError, ShardInfo

log = logging.getLogger("shardmaker.builder")


class Output:
    """The output folder: what is there, and what we may overwrite or resume."""

    def __init__(self, opts: BuildConfig, fp: str) -> None:
        self.opts, self.fp = opts, fp
        self.fs, self.root = storage.open_dir(opts.out, opts.sample.storage_options)
        self.state_root = storage.join(self.root, STATE_DIR)
        self.final_name = MANIFEST if opts.part is None else part_manifest_name(opts.part)

    def path(self, name: str) -> str:
        return storage.join(self.root, name)

    def _ours(self, name: str) -> bool:
        part = self.opts.part
        if part is None:
            return bool(SHARD_FILE.match(name))
        return name.startswith(f"shard-{part[0]:04d}-") and bool(SHARD_FILE.match(name))

    def listing(self) -> list[str]:
        if not self.fs.exists(self.root):
            return []
        return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(storage.read_bytes(self.fs, self.path(name)))
        except FileNotFoundError:
            return None
        except ValueError:
            return {}

    def finished(self) -> tuple[Manifest | None, str | None]:
        """The manifest of an identical finished build, or why the folder holds another dataset."""
        for name in (MANIFEST, self.final_name):
            doc = self.read_json(name)
            if doc is None:
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("build", {}), dict):
                return None, f"{self.path(name)} is not a wdsr manifest"
            if doc.get("build", {}).get("fingerprint") == self.fp:
                return Manifest.from_json(doc, where=self.path(name), allow_empty=True), None
            if name == MANIFEST or self.opts.part is not None:
                return None, f"{self.path(name)} describes a different dataset"
        return None, None

    def _refuse(self, why: str) -> None:
        if not self.opts.overwrite:
            raise BuildError(f"{self.opts.out}: {why}; refusing to overwrite it (pass --overwrite to replace it)")

    def states(self) -> dict[str, dict[str, Any]]:
        if not self.fs.exists(self.state_root):
            return {}
        found = {}
        for p in self.fs.ls(self.state_root, detail=False):
            name = p.rsplit("/", 1)[-1]
            if name.endswith(".json") and self._ours(name[: -len(".json")]):
                try:
                    doc = json.loads(storage.read_bytes(self.fs, p))
                except (ValueError, RecursionError):
                    continue
                if isinstance(doc, dict) and {"fingerprint", "shard", "next_sample"} <= set(doc):
                    found[name[: -len(".json")]] = doc  # a build record of ours; anything else is left alone
        return found

    def conflict(self, conflict: str | None) -> str | None:
        """Why the folder holds something other than this build (None: empty, or ours to resume)."""
        states = self.states()
        recorded = {n for n, s in states.items() if s.get("fingerprint") == self.fp}
        foreign = sorted(set(states) - recorded)
        strays = [n for n in self.listing() if self._ours(n) and n not in recorded]
        if conflict is None and foreign:
            conflict = f"holds an unfinished build of a different dataset ({foreign[0]})"
        if conflict is None and strays and not recorded:
            conflict = f"already holds shards ({strays[0]}, ...) that this build did not write"
        return conflict

    def replaceable(self, extra_known: set[str] | frozenset[str] = frozenset()) -> tuple[set[str], list[str]]:
        """``(names to delete, build records to delete)`` of the dataset in the folder: only what a
        wdsr manifest or record lists; shard-named files nobody lists make it a refusal."""
        names = self.listing()
        records = self.states()
        parts = [n for n in names if n.startswith("manifest.part-") and n.endswith(".json")]
        if self.opts.part is not None:
            parts = [n for n in parts if n == self.final_name]
            records = {k: v for k, v in records.items() if self._ours(k)}
        listed = outdir.listed_names(self.fs, self.root, self.opts.out, parts, records)
        strays = [n for n in names if self._ours(n) and n not in listed and n not in extra_known]
        if strays:
            raise BuildError(
                f"{self.opts.out}: holds {strays[0]}, named like a shard, that no wdsr manifest or "
                "build record lists; refusing to delete it, even with --overwrite"
            )
        if self.opts.part is None:
            listed.discard(self.final_name)  # the whole-build swap writes it last
        return listed, [f"{k}.json" for k in records]

    def prepare(self, conflict: str | None) -> tuple[list[ShardInfo], int, list[Skipped]]:
        """Check the folder; return the reusable finished shards, samples done, skips so far."""
        states = self.states()
        names = self.listing()
        if conflict is not None:  # a part build with --overwrite: delete only what wdsr lists, in place
            self._refuse(conflict)
            doomed, records = self.replaceable()
            log.warning("--overwrite: removing the previous part in %s", self.opts.out)
            for n in doomed:
                storage.discard(self.fs, self.path(n))
            for r in records:
                storage.discard(self.fs, storage.join(self.state_root, r))
            states = {}
        for n in names:  # stale temp files from a killed build
            if n.endswith(storage.PARTIAL_SUFFIX) and (self._ours(n[: -len(storage.PARTIAL_SUFFIX)]) or n.startswith("manifest")):
                storage.discard(self.fs, self.path(n))
        reused: list[ShardInfo] = []
        done, skipped = 0, []
        while True:
            name = shard_name(len(reused), self.opts.part)
            st = states.get(name)
            if not st or st.get("fingerprint") != self.fp:
                break
            try:
                info = ShardInfo.from_json(st.get("shard"), where=self.path(f"_build/{name}.json"))
            except ManifestError:
                break  # a damaged record: rebuild from here
            try:
                if self.fs.size(self.path(name)) != info.bytes:
                    break
            except FileNotFoundError:
                break
            reused.append(info)
            done = int(st["next_sample"])
            skipped = [Skipped(**x) for x in st.get("skipped", [])]
        return reused, done, skipped

    def record(self, info: ShardInfo, next_sample: int, skipped: list[Skipped]) -> None:
        doc = {
            "fingerprint": self.fp,
            "shard": info.to_json(),
            "next_sample": next_sample,
            "skipped": [s.to_json() for s in skipped],
        }
        self.fs.makedirs(self.state_root, exist_ok=True)
        storage.write_atomic(self.fs, storage.join(self.state_root, info.name + ".json"), json.dumps(doc).encode())

    def cleanup(self, shards: list[ShardInfo]) -> None:
        """After the manifest: drop our state files and shards of ours the manifest lacks."""
        listed = {s.name for s in shards}
        for name in self.states():
            storage.discard(self.fs, storage.join(self.state_root, name + ".json"))
        try:
            if self.fs.exists(self.state_root) and not self.fs.ls(self.state_root, detail=False):
                self.fs.rmdir(self.state_root)
        except OSError:
            pass
        for n in self.listing():
            if self._ours(n) and n not in listed:
                storage.discard(self.fs, self.path(n))
