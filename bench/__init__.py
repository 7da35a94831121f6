"""Benchmarks of wdsr and shardmaker, each run from the repository root as ``python -m bench.NAME``.

What they share (the 4K real-photo test shards, timers, tables) is in ``bench.common``; results and
commands are in bench/README.md.
"""
