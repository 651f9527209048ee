"""`<store>/epochs`: where each epoch's records start in this broker's commit log (RocketMQ
`EpochFileCache`), and `consistent_offset`, the end of the history a slave shares with its master.

An entry (epoch, start_offset) is written by a broker that becomes master at `epoch` (its log end
then), and copied by slaves once their log reaches it, so every replica of a set holds the same
entries up to its own end. A deposed master that rejoins as a slave finds, with the new master's
entries, the last offset both logs agree on, and truncates everything after it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

Epoch = tuple[int, int]          # (epoch, commit-log offset where its records start)
MAX_EPOCHS = 4_096               # entries kept (and accepted in a hello)


def consistent_offset(master: Sequence[Epoch], master_end: int, slave: Sequence[Epoch], slave_end: int) -> int | None:
    """The commit-log offset up to which the slave's log is the master's: the end, in both logs,
    of the newest epoch they share with the same start (the earlier of the two ends); None when
    they share none (no epochs on one side: the caller compares ends only)."""
    starts = dict(master)
    for index in range(len(slave) - 1, -1, -1):
        epoch, start = slave[index]
        if starts.get(epoch) != start:
            continue
        later_master = [s for e, s in master if e > epoch]
        master_epoch_end = min(later_master) if later_master else master_end
        slave_epoch_end = slave[index + 1][1] if index + 1 < len(slave) else slave_end
        return min(master_epoch_end, slave_epoch_end)
    return None


class EpochFile:
    """The entries, oldest first, persisted as JSON (written to a temporary file, then renamed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[Epoch] = []
        try:
            loaded = json.loads(path.read_text())
            self.entries = [(int(e), int(s)) for e, s in loaded][-MAX_EPOCHS:]
        except FileNotFoundError:
            pass
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path} is damaged ({exc}); remove it to copy the master's epochs again") from exc

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start_offset: int) -> None:
        """This broker is master from `epoch` on, its records starting at `start_offset`."""
        self._save([(e, s) for e, s in self.entries if e < epoch and s <= start_offset] + [(epoch, start_offset)])

    def adopt(self, master: Sequence[Epoch], end: int) -> bool:
        """Take the master's entries that start at or before this log's `end` (the log is the
        master's up to there); True while some entry lies beyond (call again as the log grows)."""
        within = [(int(e), int(s)) for e, s in master if s <= end]
        if within != self.entries:
            self._save(within)
        return len(within) < len(master)

    def _save(self, entries: list[Epoch]) -> None:
        self.entries = entries[-MAX_EPOCHS:]
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.entries))
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
