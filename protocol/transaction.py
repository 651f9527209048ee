"""Transactional messages' shared vocabulary (RocketMQ `MessageConst` / `MessageSysFlag`): the
properties a half message carries, the `commit_or_rollback` values of END_TRANSACTION and the
tags of op records. Pure."""

from __future__ import annotations

import enum

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"     # "true": store as a half message
PROPERTY_PRODUCER_GROUP = "PGROUP"             # the group whose producers are checked back
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"

# MessageSysFlag: the transaction type bits of sys_flag and END_TRANSACTION's commit_or_rollback.
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC

OP_TAG_REMOVED = "d"    # RocketMQ's REMOVETAG: the half message is resolved (commit, rollback, drop)
OP_TAG_CHECKED = "c"    # ours: one check-back was sent (RocketMQ re-appends the half message instead)


class LocalTransactionState(enum.Enum):
    """What a producer's local transaction decided (RocketMQ's names, `UNKNOW` spelled as there)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"

    @property
    def commit_or_rollback(self) -> int:
        """The END_TRANSACTION value: 8 commit, 12 rollback, 0 unknown."""
        return _WIRE[self]


_WIRE = {LocalTransactionState.COMMIT_MESSAGE: TRANSACTION_COMMIT_TYPE,
         LocalTransactionState.ROLLBACK_MESSAGE: TRANSACTION_ROLLBACK_TYPE,
         LocalTransactionState.UNKNOW: TRANSACTION_NOT_TYPE}


def encode_op_body(half_offsets: list[int]) -> bytes:
    """An op record's body: the half messages' queue offsets, comma-separated ASCII (RocketMQ 5)."""
    return ",".join(str(offset) for offset in half_offsets).encode("ascii")


def decode_op_body(body: bytes) -> list[int]:
    """The half queue offsets an op record names; [] for a body that names none validly."""
    offsets = []
    for part in body.decode("ascii", "replace").split(","):
        part = part.strip()
        if part.isdigit():
            offsets.append(int(part))
    return offsets
