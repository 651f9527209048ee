"""Build configuration beyond pyproject.toml: the optional C modules.

- `protocol._speedups`: C versions of pure per-message functions (protocol/message.py picks them),
  and the usual single send's fields and response (broker/processors/usual_send.py, `usual_send`,
  `send_response`);
- `broker.store._fsync`: the SYNC_FLUSH fsync thread in C, never taking the GIL
  (broker/store/fsync_thread.py, `NativeFsyncThread`);
- `broker.store._records`: a batch's commit-log records encoded in C (broker/store/record.py,
  `encode_run`; each record's CRC from the libz.so.1 it finds at import), a single send's record
  written into the commit log's map (`write_record`), its consume-queue units
  written (consume_queue.py, `write_units`), its messages' KEYS words and UNIQ_KEYs indexed in
  the key index's ring (key_index.py, `KeyRing`) and records read back (record.py, `read_stored`);
- `auth._checks`: the signed requests' nonces seen within the clock-skew window (auth/nonces.py,
  `NonceCache`) and a connection's allowed requests' key (auth/enforcer.py, `known_key`);
- `broker.trace._sets`: the message trace recorder's per-message calls (broker/trace/sets.py,
  `SetsBase`).

`optional=True`: where one cannot be compiled (no C compiler or Python headers, or not Linux), the
install goes on without it and rocketq runs its pure-Python twin."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("protocol._speedups", ["protocol/_speedups.c"], depends=["protocol/_msgpack.h"], optional=True),
    Extension("broker.store._fsync", ["broker/store/_fsync.c"], optional=True),
    Extension("broker.store._records", ["broker/store/_records.c"], depends=["protocol/_msgpack.h"],
              optional=True),
    Extension("auth._checks", ["auth/_checks.c"], optional=True),
    Extension("broker.trace._sets", ["broker/trace/_sets.c"], optional=True),
])
