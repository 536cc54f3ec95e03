"""The bulk readers (numpy over whole buffers) agree exactly with the one-unit-at-a-time definitions:
JSONL lines with parse_line, TensorBoard scalar events with event_scalars, CRCs with masked_crc32c, and the
TFRecord scan finds every intact record and only those, whatever bytes are damaged."""

from __future__ import annotations

import json
import math
import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboardX.proto import event_pb2, summary_pb2

from tuneplane.app.telemetry import limits
from tuneplane.workers.collector import jsonl, tb_events, tfrecord
from tuneplane.workers.collector.columns import PointColumns

READ_TIME = 1234.5


def _one_by_one(lines: list[bytes]) -> list[tuple]:
    """What the collector stores for these lines when each is read with parse_line."""
    out: list[tuple] = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        step, wall, metrics, refused = jsonl.parse_line(raw, READ_TIME)
        for name, reason in refused:
            out.append(("refused", i, name if limits.name_problem(name) is None else "", reason))
        for name, value in metrics:
            if limits.name_problem(name) is not None:
                out.append(("refused", i, "", limits.name_problem(name)))
            elif not limits.STEP_MIN <= step <= limits.STEP_MAX:
                out.append(("refused", i, name, limits.STEP_RANGE))
            else:
                out.append(("point", i, name, step, _same(value), _same(wall)))
    return sorted(out, key=repr)


def _same(x: float) -> object:
    return "nan" if isinstance(x, float) and math.isnan(x) else x


def _bulk(lines: list[bytes]) -> list[tuple]:
    columns = PointColumns()
    jsonl.parse_lines(lines, READ_TIME, columns)
    parsed = columns.build(list(range(len(lines))))
    out: list[tuple] = [("refused", unit, name, reason) for unit, name, reason, count in parsed.refused
                        for _ in range(count)]  # fmt: skip
    for unit, name_id, step, value, wall in zip(
        parsed.units.tolist(), parsed.name_ids.tolist(), parsed.steps.tolist(), parsed.values.tolist(),
        parsed.walls.tolist(), strict=True,
    ):  # fmt: skip
        out.append(("point", unit, parsed.names[name_id], step, _same(value), _same(wall)))
    assert parsed.units.tolist() == sorted(parsed.units.tolist())  # points in line order
    return sorted(out, key=repr)


_keys = st.sampled_from(["step", "global_step", "loss", "lr", "time", "wall_time", "timestamp", "eval",
                         "a\x00b", "x" * 600, "ok/name"])  # fmt: skip
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63, 2**63 - 1, -(2**63), 2**64 - 1, 2**53, 2**53 + 1, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_values = st.one_of(_numbers, _numbers, _numbers, st.booleans(), st.none(), st.text(max_size=3),
                    st.lists(st.integers(), max_size=2))  # fmt: skip


@st.composite
def _line(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from([b"", b"   ", b"{", b"[1,2]", b"null", b'"x"', b"\xff\xfe", b"1e400",
                                     b'{"step": 1} {"step": 2}', b'\xef\xbb\xbf{"step": 3, "a": 1}',
                                     b'{"step": 1, "a": 10' + b"0" * 400 + b"}",
                                     b'{"step": 1, "a": 1e400, "b": -1e400}',
                                     b'{"step": 2, "a": 1, "a": 2}', b'{"step": 4.0, "a": 1}',
                                     b'{"step": 4.5, "global_step": 7, "a": 1}', b'{"step": 5}',
                                     b'{"step": 6, "eval": {"loss": 1, "acc": true}}']))  # fmt: skip
    obj = {}
    if draw(st.booleans()):
        obj["step"] = draw(st.one_of(st.integers(-(2**64), 2**64), st.integers(0, 100), st.floats()))
    for key in draw(st.lists(_keys, max_size=5)):
        obj[key] = draw(_values if kind > 3 else _numbers)
    if kind == 1:
        obj["eval"] = {"loss": draw(_numbers)}
    text = json.dumps(obj)  # NaN and Infinity as Python writes them
    if kind == 2:
        text = text.replace(", ", ",")
    return text.encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line(), max_size=12))
def test_bulk_jsonl_reading_agrees_with_parse_line_line_by_line(lines: list[bytes]) -> None:
    assert _bulk(lines) == _one_by_one(lines)


@pytest.mark.parametrize("with_nan", [False, True])
def test_bulk_jsonl_reading_of_many_uniform_lines_agrees_with_parse_line(with_nan: bool) -> None:
    rng = random.Random(7)
    lines = []
    for step in range(3000):
        row = {"step": step, "loss": rng.random(), "grad_norm": step % 7, "tokens/s": rng.choice([1, 2.5])}
        if step % 500 == 0:
            row["eval_loss"] = rng.random()  # another shape now and then
        if step % 777 == 0 and with_nan:
            row["lr"] = float("nan")  # not JSON: the lines around it are decoded one by one
        lines.append(json.dumps(row).encode())
    lines[1500] = b'{"step": 9007199254740993, "loss": 1}'  # past the step range
    lines[1501] = b'{"step": 18446744073709551615, "loss": 1, "time": 5}'  # past int64 as well
    lines[1502] = b'{"step": 7, "loss": 18446744073709551615, "time": 1e308, "wall_time": 12}'
    assert _bulk(lines) == _one_by_one(lines)


_flat_numbers_only = st.dictionaries(_keys, _numbers.filter(lambda x: not isinstance(x, float) or
                                                            math.isfinite(x)), max_size=5)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_flat_numbers_only.map(lambda d: json.dumps(d).encode()), min_size=1, max_size=12))
def test_bulk_reading_of_number_only_lines_agrees_with_parse_line(lines: list[bytes]) -> None:
    assert _bulk(lines) == _one_by_one(lines)


def _event(tag: str, step: int, wall: float, value: float) -> bytes:
    event = event_pb2.Event(wall_time=wall, step=step)
    event.summary.value.append(summary_pb2.Summary.Value(tag=tag, simple_value=value))
    return event.SerializeToString()


_tags = st.sampled_from(["loss", "eval/acc", "t" * 120, "t" * 130, "", "ü/ñ"])


@st.composite
def _record(draw) -> bytes:
    kind = draw(st.integers(0, 6))
    tag = draw(_tags)
    step = draw(st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 300)))
    wall = draw(st.floats(allow_nan=True))
    value = draw(st.floats(width=32, allow_nan=False))
    if kind == 0:
        event = event_pb2.Event(wall_time=wall, step=step)
        event.summary.value.append(summary_pb2.Summary.Value(tag=tag, simple_value=value))
        event.summary.value.append(summary_pb2.Summary.Value(tag="second", simple_value=1.0))
        return event.SerializeToString()
    if kind == 1:
        return event_pb2.Event(wall_time=wall, file_version="brain.Event:2").SerializeToString()
    if kind == 2:
        return draw(st.binary(max_size=40))  # not an event at all, or some other one
    return _event(tag, step, wall, value)


@settings(max_examples=300, deadline=None)
@given(st.lists(_record(), max_size=40))
def test_bulk_scalar_decoding_agrees_with_event_scalars(payloads: list[bytes]) -> None:
    data = b"".join(payloads)
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if payloads else lengths
    found = tb_events.simple_scalars(data, starts, lengths)
    k = 0
    for i, payload in enumerate(payloads):
        if not found.matched[i]:
            continue
        got = (found.tags[found.tag_ids[k]], int(found.steps[k]), found.walls[k], found.values[k])
        k += 1
        assert [tuple(map(_same, got))] == [tuple(map(_same, x)) for x in
                                            tb_events.event_scalars(payload, "s", {})]  # fmt: skip
    # The layout every add_scalar writes is decoded in bulk. A step, wall time or tag that is 0 or empty
    # is left out of the message, and a tag over 118 bytes makes the summary 128 bytes or more (a
    # two-byte length): those records go one by one.
    for i, payload in enumerate(payloads):
        event = event_pb2.Event()
        try:
            event.ParseFromString(payload)
        except Exception:
            continue
        values = event.summary.value
        if (payload[:1] == b"\x09" and len(values) == 1 and values[0].WhichOneof("value") == "simple_value"
                and event.step != 0 and event.wall_time != 0 and 0 < len(values[0].tag.encode()) <= 118
                and not event.file_version and not values[0].HasField("metadata")):  # fmt: skip
            assert found.matched[i], payload


def test_bulk_crc_matches_masked_crc32c_for_every_length() -> None:
    rng = random.Random(3)
    data = bytes(rng.randrange(256) for _ in range(20_000))
    offsets = np.array([rng.randrange(0, 19_000) for _ in range(3000)], dtype=np.int64)
    lengths = np.array([rng.choice([0, 1, 8, 33, 33, 33, 600]) for _ in range(3000)], dtype=np.int64)
    got = tfrecord.masked_crc32c_many(data, offsets, lengths)
    want = [tfrecord.masked_crc32c(data[o : o + n]) for o, n in zip(offsets.tolist(), lengths.tolist(),
                                                                      strict=True)]  # fmt: skip
    assert got.tolist() == want


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=60), min_size=1, max_size=60),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), max_size=4),
    st.booleans(),
)
def test_scan_finds_exactly_the_intact_records_around_any_flipped_bits(
    payloads: list[bytes], flips: list[tuple[int, int]], final: bool
) -> None:
    framed = [tfrecord.frame(p) for p in payloads]
    data = bytearray(b"".join(framed))
    bounds = np.cumsum([0] + [len(f) for f in framed])
    for position, bit in flips:
        data[position % len(data)] ^= 1 << bit
    touched = {i for i, f in enumerate(framed) if bytes(data[bounds[i] : bounds[i + 1]]) != f}
    found = tfrecord.scan(bytes(data), 100, final=final)
    intact = [(100 + int(bounds[i + 1]), payloads[i]) for i in range(len(payloads)) if i not in touched]
    # A damaged record may hide the intact ones right after it only until the reader resynchronises:
    # with `final` every intact record is found; without it a damaged tail waits for more bytes.
    got = found.records
    if final:
        assert got == intact
        assert found.consumed == len(data)
    else:
        assert got == intact[: len(got)]
    for damage in found.damage:
        first = int(np.searchsorted(bounds, damage.offset - 100, side="right")) - 1
        assert first in touched or damage.reason == tfrecord.CUT_SHORT
    assert struct.calcsize("<QI") == tfrecord.HEADER_SIZE


@pytest.mark.parametrize("seed", range(6))
def test_scan_of_a_long_file_of_repeating_lengths_finds_every_intact_record(seed: int) -> None:
    # Lengths that repeat with a period (three tags a step) are walked by prediction; damage anywhere in
    # such a run must still cost only the records it touches.
    rng = random.Random(seed)
    payloads = [_event(tag, step, 1000.0 + step, 0.5) for step in range(1, 3000)
                for tag in ("loss", "lr", "grad/norm")]  # fmt: skip
    framed = [tfrecord.frame(p) for p in payloads]
    data = bytearray(b"".join(framed))
    bounds = np.cumsum([0] + [len(f) for f in framed])
    for _ in range(rng.randrange(0, 6)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    touched = {i for i, f in enumerate(framed) if bytes(data[bounds[i] : bounds[i + 1]]) != f}
    found = tfrecord.scan(bytes(data), 0, final=True)
    intact = [(int(bounds[i + 1]), payloads[i]) for i in range(len(payloads)) if i not in touched]
    assert found.records == intact
    assert {int(np.searchsorted(bounds, d.offset, side="right")) - 1 for d in found.damage} == touched


def test_a_line_nested_too_deep_is_refused_alone() -> None:
    # json's decoder raises RecursionError (not ValueError) on deep nesting: it must not end the reading.
    lines = [b'{"step": 1, "loss": 2}', b"[" * 100_000 + b"]" * 100_000, b'{"step": 2, "a": {"b": ' * 3000,
             b'{"step": 3, "loss": 4}']  # fmt: skip
    assert _bulk(lines) == _one_by_one(lines)
    assert [p for p in _bulk(lines) if p[0] == "point"] == [
        ("point", 0, "loss", 1, 2.0, READ_TIME),
        ("point", 3, "loss", 3, 4.0, READ_TIME),
    ]
