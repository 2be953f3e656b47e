"""Records of an offline W&B run (its run-<id>.wandb file), read without wandb's service."""

import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7  # ":W&B", magic 0xBEE1, version 0


def records(path: Path):
    """Every wandb_internal_pb2.Record in ``path``: the LevelDB log format (32 KiB blocks of checksummed
    chunks: 4-byte CRC, 2-byte length, 1-byte type: 1 full, 2 first, 3 middle, 4 last) after a 7-byte header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", path
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record
