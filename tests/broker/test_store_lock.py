"""One broker per store directory: the second one fails at start, says who holds it, and leaves the
store alone (RocketMQ's `<store>/lock`)."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.store.lock import StoreLock, StoreLocked, read_holder
from client.api import ClientAPI
from tests.conftest import broker_config
from tests.helpers import pull_header, send

REPO = Path(__file__).resolve().parents[2]


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under `root`: (size, mtime_ns, sha256 of the content)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns,
                                       hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


async def test_a_second_broker_on_the_same_store_dir_fails_naming_the_holder(
        tmp_path: Path, client_api: ClientAPI) -> None:
    first = Broker(broker_config(tmp_path))
    async with first:
        assert read_holder(first.config.store.path / "lock") == (os.getpid(), socket.gethostname())
        second = Broker(broker_config(tmp_path))
        with pytest.raises(StoreLocked) as raised:
            await second.start()
        message = str(raised.value)
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message and "--store-dir" in message
        assert str(first.config.store.path) in message and "\n" not in message
        assert raised.value.holder_pid == os.getpid()
        with pytest.raises(RuntimeError):
            _ = second.address                  # it never listened
        await second.stop()                     # harmless, and does not release the first's lock
        await send(client_api, first.address, "t", b"still served")
        result = await client_api.pull_message(first.address, pull_header(topic="t"), 3_000)
        assert [m.body for m in result.messages] == [b"still served"]
    # released at stop: a broker can open the store again and finds the message
    async with Broker(broker_config(tmp_path)) as third:
        result = await client_api.pull_message(third.address, pull_header(topic="t"), 3_000)
        assert [m.body for m in result.messages] == [b"still served"]


async def test_a_refused_broker_reads_and_writes_nothing_in_the_store(tmp_path: Path, client_api: ClientAPI) -> None:
    async with Broker(broker_config(tmp_path)) as broker:
        await send(client_api, broker.address, "t", b"x")
    store = tmp_path / "store"
    holder = StoreLock(store)            # another holder, quiet, so any change is the refused broker's
    holder.acquire()
    try:
        before = snapshot(store)
        with pytest.raises(StoreLocked):
            await Broker(broker_config(tmp_path)).start()
        assert snapshot(store) == before
    finally:
        holder.release()
    assert StoreLock(store).path.read_text() == "", "the holder note is emptied at release"


def _rocketq_broker_start(store: Path) -> list[str]:
    return [sys.executable, "-m", "rocketq", "broker", "start", "--listen-port", "0", "--store-dir", str(store),
            "--set", "metrics_port=0", "--set", "grpc_port=0"]


def test_cli_second_broker_on_a_store_dir_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = subprocess.Popen(_rocketq_broker_start(store), cwd=REPO, text=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        assert first.stderr is not None
        for _ in range(200):
            line = first.stderr.readline()
            assert line, "the first broker exited before listening"
            if "listening on " in line:
                break
        second = subprocess.run(_rocketq_broker_start(store), cwd=REPO, capture_output=True, text=True,
                                timeout=30, check=False)
        assert second.returncode == 1, second.stderr
        assert "Traceback" not in second.stderr
        errors = [line for line in second.stderr.splitlines() if line.startswith("rocketq: ")]
        assert errors == [f"rocketq: store directory {store} is in use by another broker (pid {first.pid} on "
                          f"{socket.gethostname()} holds {store / 'lock'}); stop it or give this broker "
                          f"another --store-dir"], second.stderr
        assert first.poll() is None, "the first broker still runs"
        first.send_signal(signal.SIGTERM)
        _, log = first.communicate(timeout=15)
        assert first.returncode == 0, log
    finally:
        if first.returncode is None:
            first.kill()
            first.communicate()
