"""Reading TensorBoard event files without TensorFlow: real writers, both value forms, damage and resumes."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

from tuneplane.workers.collector import tfrecord
from tuneplane.workers.collector.sources import READ_CHUNK, OutputTracker


def _read_all(root: Path, max_points: int = 10_000) -> list:
    tracker = OutputTracker(root)
    tracker.discover()
    points = []
    for chunk in tracker.read(max_points):
        points.extend(chunk.points)
    tracker.close()
    return points


def _torch_events(root: Path, n: int = 300) -> Path:
    SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter

    writer = SummaryWriter(log_dir=str(root / "run"))
    for step in range(n):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
        if step % 10 == 0:
            writer.add_scalar("lr", 0.001 * step, step)
    writer.close()
    return next((root / "run").glob("*tfevents*"))


def test_reads_every_scalar_written_by_torch_summary_writer(tmp_path: Path) -> None:
    _torch_events(tmp_path, 300)
    points = _read_all(tmp_path)
    loss = [(p.step, p.value) for p in points if p.name == "train/loss"]
    lr = [(p.step, p.value) for p in points if p.name == "lr"]
    assert [s for s, _ in loss] == list(range(300))
    assert loss[7][1] == pytest.approx(np.float32(1.0 / 8), rel=1e-7)
    assert [s for s, _ in lr] == list(range(0, 300, 10))
    assert {p.source for p in points} == {"tensorboard:run"}


def test_reads_tensorboardx_writer_output(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir=str(tmp_path / "tbx"))
    for step in range(50):
        writer.add_scalar("eval/loss", step * 0.5, step)
    writer.close()
    points = _read_all(tmp_path)
    assert [(p.step, p.value) for p in points] == [(s, s * 0.5) for s in range(50)]


def test_file_cut_in_the_middle_of_a_record_yields_complete_records_then_resumes(tmp_path: Path) -> None:
    full = _torch_events(tmp_path / "src", 200).read_bytes()
    records = list(tfrecord.scan(full).records)
    cut_at = records[120][0] - 7  # seven bytes short of the end of record 120
    run = tmp_path / "out" / "run"
    run.mkdir(parents=True)
    target = run / "events.out.tfevents.1.host"
    target.write_bytes(full[:cut_at])

    tracker = OutputTracker(tmp_path / "out")
    tracker.discover()
    first = [p for chunk in tracker.read(10_000) for p in chunk.points]
    state = next(iter(tracker.states.values()))
    assert state.offset == records[119][0]  # stopped before the partial record
    assert state.bad_records == 0

    with open(target, "ab") as handle:  # the writer finishes the record and the rest of the file
        handle.write(full[cut_at:])
    second = [p for chunk in tracker.read(10_000) for p in chunk.points]
    tracker.close()
    steps = [p.step for p in first + second if p.name == "train/loss"]
    assert steps == list(range(200))
    assert state.offset == len(full)


def _event(step: int, value: summary_pb2.Summary.Value) -> bytes:
    event = event_pb2.Event(wall_time=1000.0 + step, step=step)
    event.summary.value.append(value)
    return event.SerializeToString()


def _tf2_value(tag: str, number: float, first: bool, *, content: bool, dtype: int = types_pb2.DT_FLOAT):
    tensor = tensor_pb2.TensorProto(dtype=dtype)
    fmt = {types_pb2.DT_FLOAT: "<f", types_pb2.DT_DOUBLE: "<d"}[dtype]
    if content:
        tensor.tensor_content = struct.pack(fmt, number)
    elif dtype == types_pb2.DT_FLOAT:
        tensor.float_val.append(number)
    else:
        tensor.double_val.append(number)
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    if first:  # TF2 attaches the plugin metadata to a tag's first value only
        value.metadata.plugin_data.plugin_name = "scalars"
    return value


def test_tf2_tensor_values_in_tensor_content_and_float_val_are_decoded(tmp_path: Path) -> None:
    header = event_pb2.Event(wall_time=999.0, file_version="brain.Event:2").SerializeToString()
    records = [header]
    for step in range(5):
        records.append(_event(step, _tf2_value("c", step + 0.25, step == 0, content=True)))
        records.append(_event(step, _tf2_value("f", step + 0.5, step == 0, content=False)))
        records.append(
            _event(step, _tf2_value("d", step + 0.125, step == 0, content=True, dtype=types_pb2.DT_DOUBLE))
        )
    # An image-like tensor tag must not become a scalar.
    image = summary_pb2.Summary.Value(tag="img", tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING))
    image.metadata.plugin_data.plugin_name = "images"
    records.append(_event(9, image))
    (tmp_path / "events.out.tfevents.2.tf").write_bytes(b"".join(tfrecord.frame(r) for r in records))
    points = _read_all(tmp_path)
    by_name: dict[str, list] = {}
    for p in points:
        by_name.setdefault(p.name, []).append((p.step, p.value, p.wall_time))
    assert set(by_name) == {"c", "f", "d"}
    assert [v for _, v, _ in by_name["c"]] == [s + 0.25 for s in range(5)]
    assert [v for _, v, _ in by_name["f"]] == [s + 0.5 for s in range(5)]
    assert [v for _, v, _ in by_name["d"]] == [s + 0.125 for s in range(5)]
    assert by_name["c"][3][2] == 1003.0


def test_tag_plugins_survive_a_resume_from_checkpoint(tmp_path: Path) -> None:
    from tuneplane.workers.collector.sources import FileState

    records = [_event(s, _tf2_value("c", float(s), s == 0, content=True)) for s in range(4)]
    path = tmp_path / "events.out.tfevents.3.tf"
    path.write_bytes(b"".join(tfrecord.frame(r) for r in records[:2]))
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    first = [p.step for c in tracker.read(100) for p in c.points]
    saved = {k: FileState.from_checkpoint(s.checkpoint()) for k, s in tracker.states.items()}
    tracker.close()
    with open(path, "ab") as handle:
        handle.write(b"".join(tfrecord.frame(r) for r in records[2:]))
    resumed = OutputTracker(tmp_path, saved)
    resumed.discover()
    second = [p.step for c in resumed.read(100) for p in c.points]
    resumed.close()
    assert first == [0, 1]
    assert second == [2, 3]  # later values have no metadata; the remembered plugin still marks them scalars


def _simple_frames(n: int) -> list[bytes]:
    return [tfrecord.frame(_event(s, summary_pb2.Summary.Value(tag="x", simple_value=s))) for s in range(n)]


def test_bad_data_crc_skips_and_counts_the_record(tmp_path: Path) -> None:
    frames = _simple_frames(10)
    broken = bytearray(frames[4])
    broken[14] ^= 0x01  # a flipped bit inside the data
    frames[4] = bytes(broken)
    (tmp_path / "events.out.tfevents.4.x").write_bytes(b"".join(frames))
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    chunks = list(tracker.read(100))
    tracker.close()
    assert [p.step for c in chunks for p in c.points] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    offset = sum(len(f) for f in frames[:4])
    assert [d for c in chunks for d in c.damage] == [
        tfrecord.Damage(offset, len(frames[4]), tfrecord.BAD_DATA_CRC)
    ]


def test_flipped_length_byte_loses_one_record_not_the_rest_of_the_file(tmp_path: Path) -> None:
    frames = _simple_frames(3000)
    for index, at in ((600, 2), (2100, 20)):  # a length byte of one record, a payload byte of another
        broken = bytearray(frames[index])
        broken[at] ^= 0x40
        frames[index] = bytes(broken)
    path = tmp_path / "events.out.tfevents.5.x"
    path.write_bytes(b"".join(frames))
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    chunks = list(tracker.read(1000))
    with open(path, "ab") as handle:  # the writer goes on after the damage
        handle.write(tfrecord.frame(_event(5000, summary_pb2.Summary.Value(tag="x", simple_value=1.0))))
    later = [p.step for c in tracker.read(1000) for p in c.points]
    tracker.close()
    steps = [p.step for c in chunks for p in c.points]
    assert steps == [s for s in range(3000) if s not in (600, 2100)]
    assert later == [5000]
    damage = [d for c in chunks for d in c.damage]
    assert damage == [
        tfrecord.Damage(sum(len(f) for f in frames[:600]), len(frames[600]), tfrecord.BAD_LENGTH),
        tfrecord.Damage(sum(len(f) for f in frames[:2100]), len(frames[2100]), tfrecord.BAD_DATA_CRC),
    ]


def test_cut_short_tail_is_damage_only_once_the_writer_is_gone(tmp_path: Path) -> None:
    frames = _simple_frames(5)
    path = tmp_path / "events.out.tfevents.6.x"
    path.write_bytes(b"".join(frames) + frames[0][:9])
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    assert [p.step for c in tracker.read(100) for p in c.points] == [0, 1, 2, 3, 4]
    assert tracker.unread()
    final = list(tracker.read(100, final=True))
    tracker.close()
    assert [d for c in final for d in c.damage] == [
        tfrecord.Damage(sum(len(f) for f in frames), 9, tfrecord.CUT_SHORT)
    ]


def _image_frame(step: int, size: int) -> bytes:
    image = summary_pb2.Summary.Image(height=1, width=1, colorspace=3, encoded_image_string=b"\x89" * size)
    return tfrecord.frame(_event(step, summary_pb2.Summary.Value(tag="sample", image=image)))


def test_a_record_longer_than_one_read_is_read_and_the_file_goes_on(tmp_path: Path) -> None:
    # An image (or a graph) record bigger than the collector's largest read used to stop the file there.
    frames = _simple_frames(3)
    big = _image_frame(3, READ_CHUNK + 1024 * 1024)
    path = tmp_path / "events.out.tfevents.7.x"
    path.write_bytes(b"".join(frames) + big + _simple_frames(6)[5])
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    steps = []
    for _ in range(4):  # a few polls, as the collector's loop makes them
        steps += [p.step for c in tracker.read(100) for p in c.points]
    assert steps == [0, 1, 2, 5]
    assert not tracker.unread()
    tracker.close()


def test_a_long_record_cut_short_by_a_dead_writer_is_damage_and_the_file_is_done(tmp_path: Path) -> None:
    frames = _simple_frames(2)
    big = _image_frame(2, READ_CHUNK + 4 * 1024 * 1024)
    cut = len(big) - 2 * 1024 * 1024  # more than one read of it is there, not all
    path = tmp_path / "events.out.tfevents.8.x"
    path.write_bytes(b"".join(frames) + big[:cut])
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    assert [p.step for c in tracker.read(100) for p in c.points] == [0, 1]
    assert [c for c in tracker.read(100) if c.news] == []  # the writer may still finish it
    final = [d for _ in range(3) for c in tracker.read(100, final=True) for d in c.damage]
    assert final == [tfrecord.Damage(sum(len(f) for f in frames), cut, tfrecord.CUT_SHORT)]
    assert not tracker.unread()
    tracker.close()


def test_masked_crc_matches_the_tfrecord_definition() -> None:
    # Known vector: the masked CRC32C of eight zero bytes as TensorFlow writes it for an empty record.
    length = struct.pack("<Q", 0)
    import google_crc32c

    crc = google_crc32c.value(length)
    assert tfrecord.masked_crc32c(length) == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert tfrecord.scan(tfrecord.frame(b"")).records == [(16, b"")]


def test_add_scalars_sub_runs_are_named_by_their_directory_suffix(tmp_path: Path) -> None:
    SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "run"))
    for step in range(20):
        writer.add_scalars("eval", {"loss": 1.0 / (step + 1), "accuracy": step / 20}, step)
        writer.add_scalars("train/tokens", {"throughput": 100.0 + step}, step)
        writer.add_scalar("train/loss", 2.0, step)
    writer.close()
    points = _read_all(tmp_path)
    names = {(p.source, p.name) for p in points}
    assert names == {
        ("tensorboard:run/eval_loss", "eval/loss"),
        ("tensorboard:run/eval_accuracy", "eval/accuracy"),
        ("tensorboard:run/train_tokens_throughput", "train/tokens/throughput"),
        ("tensorboard:run", "train/loss"),
    }
    assert len(points) == 80


def test_a_damaged_region_read_in_pieces_is_reported_once_whole(tmp_path: Path) -> None:
    frames = _simple_frames(40)
    broken = bytearray(frames[20])
    broken[1] ^= 0x08  # its length field
    frames[20] = bytes(broken)
    data = b"".join(frames)
    at = sum(len(f) for f in frames[:20])
    path = tmp_path / "events.out.tfevents.7.x"
    tracker = OutputTracker(tmp_path)
    damage, steps = [], []
    # The writer's bytes arrive in pieces that cut the damaged record and the one after it.
    for cut in (at + 5, at + 14, at + len(frames[20]) + 3, len(data)):
        path.write_bytes(data[:cut])
        tracker.discover()
        for chunk in tracker.read(1000):
            damage += chunk.damage
            steps += [p.step for p in chunk.points]
    tracker.close()
    assert damage == [tfrecord.Damage(at, len(frames[20]), tfrecord.BAD_LENGTH)]
    assert steps == [s for s in range(40) if s != 20]


def test_a_file_with_thousands_of_damaged_records_never_makes_a_batch_the_gateway_refuses(
    tmp_path: Path,
) -> None:
    """Every other record with a bad data CRC: one read's chunk carried 12,103 damaged regions, the gateway
    refuses a batch with more than 10,000 entries as malformed (400, final), and the chunk's 12,103 intact
    points went with it. Regions beyond the per-batch cap now become one spanning region that says how
    many there were."""
    from tuneplane.app.telemetry import wire

    frames = _simple_frames(40_000)
    for index in range(1, len(frames), 2):
        broken = bytearray(frames[index])
        broken[-1] ^= 0x01  # the data CRC
        frames[index] = bytes(broken)
    (tmp_path / "events.out.tfevents.5.x").write_bytes(b"".join(frames))
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    chunks = []
    while tracker.unread():
        chunks += list(tracker.read(65_536, final=True))
    state = next(iter(tracker.states.values()))
    tracker.close()
    assert sorted(p.step for c in chunks for p in c.points) == list(range(0, 40_000, 2))
    assert max(len(c.damage) for c in chunks) <= wire.MAX_ENTRIES
    folded = [d for c in chunks for d in c.damage if d.reason != tfrecord.BAD_DATA_CRC]
    exact = sum(len(c.damage) for c in chunks) - len(folded)
    assert exact + sum(int(d.reason.split(": ")[1].split()[0]) for d in folded) == 20_000 == state.bad_records


def test_refusals_of_thousands_of_distinct_names_never_make_a_batch_the_gateway_refuses(
    tmp_path: Path,
) -> None:
    """A line per step with a new text field (`sample_17_text`): one chunk carried a refusal entry per
    name, more than the gateway takes in a batch, so the batch and its points were refused whole."""
    from tuneplane.app.telemetry import wire

    with open(tmp_path / "metrics.jsonl", "w") as handle:
        for step in range(12_000):
            texts = f'"sample_{step}_text": "hi", "sample_{step}_id": "a"'
            handle.write(f'{{"step": {step}, "loss": 0.5, {texts}}}\n')
    tracker = OutputTracker(tmp_path)
    tracker.discover()
    chunks = list(tracker.read(65_536))
    tracker.close()
    assert sum(c.count for c in chunks) == 12_000
    assert max(len(c.refused) for c in chunks) <= wire.MAX_ENTRIES
    assert sum(n for c in chunks for n in c.refused.values()) == 24_000
