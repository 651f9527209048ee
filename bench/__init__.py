"""Broker benchmarks: each starts a broker subprocess, drives it with `ClientAPI` on uvloop, and
reports a plain table plus JSON under `bench/results/`.

    .venv/bin/python -m bench [--quick] [--only NAME]...
    .venv/bin/python -m bench.replay [--quick]
"""
