"""Scalars from TensorBoard event records (protobuf messages from tensorboardX's compiled protos).

Two value forms exist: `simple_value` (PyTorch's SummaryWriter, tensorboardX, TF1) and a TF2 `tensor`
value whose number TensorFlow's C++ writer puts in `tensor_content` (raw little-endian bytes) rather than in
`float_val`; both are decoded. TF2 attaches plugin metadata only to a tag's first value, so the tag → plugin
map is per-file state that the caller keeps (and checkpoints) across reads.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import types
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from tuneplane.workers.collector.tfrecord import values_at


def _load_protos() -> tuple[types.ModuleType, types.ModuleType]:
    """tensorboardX's compiled protos without its package __init__, which imports the writer and with it
    PyTorch when installed (1.4 s of a collector's start-up, for nothing it uses). A stand-in package
    module is present only while the protos load; a later `import tensorboardX` runs the real one, which
    finds these same proto modules."""
    if "tensorboardX" in sys.modules:
        from tensorboardX.proto import event_pb2, types_pb2

        return event_pb2, types_pb2
    spec = importlib.util.find_spec("tensorboardX")
    package = types.ModuleType("tensorboardX")
    package.__path__ = list(spec.submodule_search_locations or [])  # type: ignore[union-attr]
    package.__spec__ = spec
    sys.modules["tensorboardX"] = package
    try:
        from tensorboardX.proto import event_pb2, types_pb2
    finally:
        del sys.modules["tensorboardX"]
    return event_pb2, types_pb2


event_pb2, types_pb2 = _load_protos()

# dtype → (struct format of one element in tensor_content, name of the repeated *_val field)
_DTYPES: dict[int, tuple[str, str]] = {
    types_pb2.DT_FLOAT: ("<f", "float_val"),
    types_pb2.DT_DOUBLE: ("<d", "double_val"),
    types_pb2.DT_INT32: ("<i", "int_val"),
    types_pb2.DT_INT64: ("<q", "int64_val"),
    types_pb2.DT_HALF: ("<e", "half_val"),
}
_SCALAR_PLUGINS = ("", "scalars")


def _half_from_bits(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]


def tensor_scalar(tensor) -> float | None:
    """The single number in a scalar-shaped numeric tensor, or None for anything else."""
    if any(dim.size != 1 for dim in tensor.tensor_shape.dim):
        return None
    spec = _DTYPES.get(tensor.dtype)
    if tensor.dtype == types_pb2.DT_BFLOAT16:
        if len(tensor.tensor_content) == 2:
            return struct.unpack("<f", b"\0\0" + tensor.tensor_content)[0]
        if len(tensor.half_val) == 1:
            return struct.unpack("<f", struct.pack("<I", (tensor.half_val[0] & 0xFFFF) << 16))[0]
        return None
    if spec is None:
        return None
    fmt, field_name = spec
    content = tensor.tensor_content
    if content:
        if len(content) != struct.calcsize(fmt):
            return None
        return float(struct.unpack(fmt, content)[0])
    values = getattr(tensor, field_name)
    if len(values) != 1:
        return None
    if tensor.dtype == types_pb2.DT_HALF:
        return _half_from_bits(values[0])
    return float(values[0])


class EventDecodeError(ValueError):
    pass


def event_scalars(
    data: bytes, source: str, tag_plugins: MutableMapping[str, str]
) -> Iterator[tuple[str, int, float, float]]:
    """(tag, step, wall_time, value) for each scalar in one serialized Event; updates `tag_plugins`."""
    event = event_pb2.Event()
    try:
        event.ParseFromString(data)
    except DecodeError as exc:
        raise EventDecodeError(str(exc)) from exc
    if not event.HasField("summary"):
        return
    step = event.step
    wall_time = event.wall_time
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        tag = value.tag
        if value.HasField("metadata") and value.metadata.HasField("plugin_data"):
            tag_plugins[tag] = value.metadata.plugin_data.plugin_name
        if kind == "simple_value":
            yield tag, step, wall_time, float(value.simple_value)
        elif kind == "tensor":
            if tag_plugins.get(tag, "") not in _SCALAR_PLUGINS:
                continue
            number = tensor_scalar(value.tensor)
            if number is not None:
                yield tag, step, wall_time, number


# The one layout PyTorch's and tensorboardX's add_scalar write, field by field:
#   09 <wall_time f64>  10 <step varint>  2a <summary len>  0a <value len>  0a <tag len> <tag>  15 <f32>
# Records in exactly this layout are decoded in bulk (numpy over all of them at once); any other record
# (step 0 or wall time 0 omitted, more than one value, metadata, tensors, a tag of 128+ bytes) goes
# through event_scalars, which is the definition this fast path must agree with.
_MAX_VARINT = 10


@dataclass
class SimpleScalars:
    matched: np.ndarray  # bool per record: decoded here (else: decode with event_scalars)
    tags: list[str]  # distinct tags of the matched records
    tag_ids: np.ndarray  # per matched record, index into tags
    steps: np.ndarray
    walls: np.ndarray
    values: np.ndarray


def simple_scalars(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> SimpleScalars:
    """Decode the records data[starts[i] : starts[i] + lengths[i]] that are single simple_value scalars."""
    raw = np.frombuffer(data, dtype=np.uint8)
    # A record shorter than the smallest scalar event cannot match; pad reads so none runs off the buffer.
    padded = np.concatenate([raw, np.zeros(64, dtype=np.uint8)])
    ok = lengths >= 9 + 2 + 6 + 5
    s = np.where(ok, starts, 0)
    ok &= padded[s] == 0x09
    ok &= padded[s + 9] == 0x10
    varint = padded[(s + 10)[:, None] + np.arange(_MAX_VARINT)].astype(np.uint64)
    ends_here = (varint & 0x80) == 0
    ok &= ends_here.any(axis=1)
    vlen = np.argmax(ends_here, axis=1) + 1
    shifts = np.arange(_MAX_VARINT, dtype=np.uint64) * np.uint64(7)
    used = np.arange(_MAX_VARINT) < vlen[:, None]
    step = np.bitwise_or.reduce(np.where(used, (varint & np.uint64(0x7F)) << shifts, np.uint64(0)), axis=1)
    # A 10-byte varint carries at most one bit in its last byte (64 bits in all).
    ok &= (vlen < _MAX_VARINT) | (varint[:, _MAX_VARINT - 1] <= 1)
    p = s + 10 + vlen
    summary_len = padded[p + 1].astype(np.int64)
    value_len = padded[p + 3].astype(np.int64)
    tag_len = padded[p + 5].astype(np.int64)
    ok &= (padded[p] == 0x2A) & (padded[p + 2] == 0x0A) & (padded[p + 4] == 0x0A)
    ok &= (summary_len < 0x80) & (value_len < 0x80) & (tag_len < 0x80)
    ok &= (value_len == 2 + tag_len + 5) & (summary_len == 2 + value_len)
    ok &= p + 2 + summary_len == s + lengths
    ok &= padded[np.where(ok, p + 6 + tag_len, 0)] == 0x15
    matched = ok.copy()
    idx = np.flatnonzero(matched)
    tags: list[str] = []
    tag_ids = np.zeros(len(idx), dtype=np.int64)
    if len(idx):
        ms, mp, mt = s[idx], p[idx], tag_len[idx]
        for length in np.unique(mt).tolist():
            group = np.flatnonzero(mt == length)
            tag_bytes = padded[(mp[group] + 6)[:, None] + np.arange(length)]
            rows = np.ascontiguousarray(tag_bytes).view(f"V{length}").ravel() if length else None
            if rows is None:
                distinct, inverse = [b""], np.zeros(len(group), dtype=np.int64)
            else:
                uniq, inverse = np.unique(rows, return_inverse=True)
                distinct = [bytes(u) for u in uniq]
            for k, tag in enumerate(distinct):
                try:
                    text = tag.decode("utf-8")
                except UnicodeDecodeError:
                    matched[idx[group[inverse.ravel() == k]]] = False  # event_scalars says what it is
                    continue
                tag_ids[group[inverse.ravel() == k]] = len(tags)
                tags.append(text)
        keep = matched[idx]
        idx, ms, mp, mt, tag_ids = idx[keep], ms[keep], mp[keep], mt[keep], tag_ids[keep]
        walls = values_at(padded, ms + 1, "<f8")
        values = values_at(padded, mp + 7 + mt, "<f4").astype(np.float64)
        steps = step[idx].view(np.int64)
    else:
        walls = values = np.zeros(0, dtype=np.float64)
        steps = np.zeros(0, dtype=np.int64)
    return SimpleScalars(matched, tags, tag_ids, steps, walls, values)
