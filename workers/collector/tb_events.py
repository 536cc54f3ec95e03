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

from google.protobuf.message import DecodeError


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
