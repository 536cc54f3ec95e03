"""The points read from one buffer of one file, as columns, and how they are cut into chunks.

A buffer is a sequence of units (JSONL lines or TFRecord records). The readers decode whole buffers at
once where the layout allows (numpy for TensorBoard's scalar events, one JSON decode per line with the
points of many lines gathered in bulk) and record each point with the unit it came from; units are the
only places a chunk may end, so that a chunk's end offset is always the end of a whole unit and a resumed
reader never reads a unit twice or skips one.

What may be stored is checked here, once for every reader: a name that breaks app.telemetry.limits is
refused (once per name, its points counted), and so is a step outside the documented range.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from tuneplane.app.telemetry import limits

Series = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # name → (steps, values, wall times)


class PointColumns:
    """Collects points (unit index, name, step, value, wall time) and refusals, in bulk or one by one."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self._refused_names: set[str] = set()
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._one: tuple[list[int], list[int], list[int], list[float], list[float]] = ([], [], [], [], [])
        self.refused: list[tuple[int, str, str, int]] = []  # (unit, name, reason, count)

    def name_id(self, name: str) -> int | None:
        """The id of a name that may be stored; None for one that may not (its points are refused)."""
        found = self._name_ids.get(name)
        if found is not None:
            return found
        if name in self._refused_names or limits.name_problem(name) is not None:
            self._refused_names.add(name)
            return None
        self._name_ids[name] = len(self.names)
        self.names.append(name)
        return self._name_ids[name]

    def refuse(self, unit: int, name: str, reason: str, count: int = 1) -> None:
        shown = name if limits.name_problem(name) is None else ""
        self.refused.append((unit, shown, reason, count))

    def add(self, unit: int, name: str, step: int, value: float, wall: float) -> None:
        """One point (the path for units decoded one by one)."""
        name_id = self.name_id(name)
        if name_id is None:
            self.refuse(unit, name, limits.name_problem(name))  # type: ignore[arg-type]
            return
        if not limits.STEP_MIN <= step <= limits.STEP_MAX:
            self.refuse(unit, name, limits.STEP_RANGE)
            return
        units, ids, steps, values, walls = self._one
        units.append(unit)
        ids.append(name_id)
        steps.append(step)
        values.append(value)
        walls.append(wall)

    def add_many(
        self,
        units: np.ndarray,
        names: list[str],
        name_index: np.ndarray,
        steps: np.ndarray,
        values: np.ndarray,
        walls: np.ndarray,
    ) -> None:
        """Points in bulk: point i is names[name_index[i]] at steps[i] from unit units[i]."""
        if not len(units):
            return
        ids = np.array([-1 if (i := self.name_id(n)) is None else i for n in names], dtype=np.int64)
        point_ids = ids[name_index]
        in_range = (steps >= limits.STEP_MIN) & (steps <= limits.STEP_MAX)
        keep = (point_ids >= 0) & in_range
        if keep.all():
            self._parts.append((units, point_ids, steps, values, walls))
            return
        for k in np.flatnonzero(~keep).tolist():
            name = names[int(name_index[k])]
            # A name that may not be stored is its reason; otherwise the step is out of range.
            self.refuse(int(units[k]), name, limits.name_problem(name) or limits.STEP_RANGE)
        self._parts.append((units[keep], point_ids[keep], steps[keep], values[keep], walls[keep]))

    def build(self, unit_ends: list[int] | np.ndarray) -> Parsed:
        units, ids, steps, values, walls = self._one
        parts = [*self._parts]
        if units:
            parts.append(
                (
                    np.asarray(units, dtype=np.int64),
                    np.asarray(ids, dtype=np.int64),
                    np.asarray(steps, dtype=np.int64),
                    np.asarray(values, dtype=np.float64),
                    np.asarray(walls, dtype=np.float64),
                )
            )
        if not parts:
            empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
            parts = [(empty_i, empty_i, empty_i, empty_f, empty_f)]
        cols = [np.concatenate([part[i] for part in parts]) for i in range(5)]
        if len(parts) > 1:
            order = np.argsort(cols[0], kind="stable")  # unit order; within a unit, the order added
            cols = [col[order] for col in cols]
        return Parsed(np.asarray(unit_ends, dtype=np.int64), self.names, *cols, self.refused)


@dataclass
class Parsed:
    unit_ends: np.ndarray  # file offset just past each unit, increasing
    names: list[str]
    units: np.ndarray  # per point: its unit's index (non-decreasing)
    name_ids: np.ndarray
    steps: np.ndarray
    values: np.ndarray
    walls: np.ndarray
    refused: list[tuple[int, str, str, int]] = field(default_factory=list)

    def cuts(self, max_points: int) -> Iterator[tuple[int, int, int, int]]:
        """(first unit, last unit + 1, first point, last point + 1) of each chunk: a chunk ends after the
        unit that brings it to `max_points` points (a unit's points are never split)."""
        n_units = len(self.unit_ends)
        unit_start = 0
        point_start = 0
        total = len(self.units)
        while unit_start < n_units:
            target = point_start + max_points - 1
            if target >= total:
                yield unit_start, n_units, point_start, total
                return
            unit_stop = int(self.units[target]) + 1
            point_stop = int(np.searchsorted(self.units, unit_stop, side="left"))
            yield unit_start, unit_stop, point_start, point_stop
            unit_start, point_start = unit_stop, point_stop

    def series(self, start: int, stop: int) -> Series:
        """The points [start, stop) by series name, in the order the names first appear."""
        ids = self.name_ids[start:stop]
        if not len(ids):
            return {}
        steps, values, walls = self.steps[start:stop], self.values[start:stop], self.walls[start:stop]
        first = ids[0]
        if (ids == first).all():
            return {self.names[int(first)]: (steps, values, walls)}
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
        groups = np.split(order, bounds)
        groups.sort(key=lambda g: int(g[0]))
        return {self.names[int(ids[g[0]])]: (steps[g], values[g], walls[g]) for g in groups}

    def refused_in(self, unit_start: int, unit_stop: int) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for unit, name, reason, count in self.refused:
            if unit_start <= unit < unit_stop:
                counts[(name, reason)] = counts.get((name, reason), 0) + count
        return counts
