"""What the untrusted-input checks cost next to a decode, on the stream bench's 4K QOI shards.

    .venv/bin/python -m bench.format_checks_bench [--data bench/out/stream-qoi] [--samples 16] [--out bench/out]

Run after ``bench.stream_bench`` (it reads that bench's QOI shards).

Per sample: the PNG/QOI header checks (HR + LR against the manifest, the scale, max_pixels) vs
decoding the same HR + LR. Per shard: the probe (sha256 of the first and last MiB, once per process
and file) and the manifest's schema check, spread over the shard's samples.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.common import best_s as best
from bench.common import machine_line, parser, report
from shardmaker import format as fmt
from shardmaker.imaging import codecs
from wdsr.pipeline.decode import wanted_members
from wdsr.pipeline.plan import Span
from wdsr.pipeline.read import ShardReader


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--data", default="bench/out/stream-qoi")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    raw_manifest = (Path(args.data) / "manifest.json").read_bytes()
    m = fmt.parse(raw_manifest, args.data)
    reader = ShardReader(args.data, m)
    info = m.shards[0]
    codec, scale = m.codec, 4
    hr_name, lr_name = f"hr.{codec}", f"lr_x{scale}.{codec}"
    n = min(args.samples, info.samples)
    samples = list(reader.span(Span(0, 0, n), wanted_members(m, scale)))

    def checks() -> None:
        for r in samples:
            fmt.check_pair(
                fmt.image_header(r.members[hr_name], codec), fmt.image_header(r.members[lr_name], codec), scale, r.hr_size
            )

    def decodes() -> None:
        for r in samples:
            codecs.decode(r.members[hr_name], codec)
            codecs.decode(r.members[lr_name], codec)

    check_s = best(checks, 20) / n
    decode_s = best(decodes, 3) / n
    with open(Path(args.data) / info.name, "rb") as f:
        probe_s = best(lambda: fmt.probe_file(f, info.bytes))
    schema_s = best(lambda: fmt.parse(raw_manifest, args.data)) / len(m.shards)
    per_sample_shard = (probe_s + schema_s) / info.samples
    lines = [
        f"{head}; {args.data}: {codec}, {n} samples, {info.samples} per shard:",
        "",
        f"- header checks: {check_s * 1e6:.1f} us per sample; {codec} decode of HR + LR x{scale}: {decode_s * 1e3:.1f} ms "
        f"-> **{check_s / decode_s * 100:.3f}%** of a decode",
        f"- probe: {probe_s * 1e3:.2f} ms per shard, manifest schema: {schema_s * 1e3:.3f} ms per shard "
        f"-> {per_sample_shard * 1e6:.1f} us per sample = **{per_sample_shard / decode_s * 100:.3f}%** of a decode",
    ]
    report(Path(args.out), "format_checks_bench", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
