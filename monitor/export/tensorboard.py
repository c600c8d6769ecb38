"""TensorBoard: a live run's per-step input-pipeline figures as event files, where an ML
engineer already looks (`monitor run --tensorboard DIR`). An Output of the run's follow
(monitor/assess/follow.py): each handful of new steps of a rank (a window of at most the
follow's tick, 0.25 s) becomes one point of each scalar under `starvation/`, at the step of
its last step and the wall time it arrived; the verdict and its advice are text summaries,
written when they change. One folder per run (DIR/run-N), one per rank below it for a job of
many ranks (DIR/run-N/rank-R).

Written with TensorBoard's own event writer and protos (the `tensorboard` package, the
`[tensorboard]` extra): neither torch nor TensorFlow is imported (tensorboardX imports torch
where it is installed, and this process never does)."""
from __future__ import annotations

import os
import time
from typing import Any

import pandas as pd

from monitor.assess.follow import window_figures

EXTRA = "pip install 'starvation-monitor[tensorboard]'"
PREFIX = "starvation/"


class TensorBoardMissing(RuntimeError):
    """TensorBoard's writer is not installed; the message names the pip install."""


def _writer_parts() -> tuple[Any, Any, Any, Any]:
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise TensorBoardMissing(f"--tensorboard needs TensorBoard's event writer: {EXTRA}") \
            from None
    return EventFileWriter, event_pb2, summary_pb2, (tensor_pb2, types_pb2)


class TensorBoardOutput:
    """The event files of one live run (monitor/manage/outputs.py makes it from
    --tensorboard DIR; TensorBoardMissing before the run exists when the writer is not
    installed)."""

    name, takes_rows = "tensorboard", True

    def __init__(self, folder: str | os.PathLike[str], store: Any = None) -> None:
        self.Writer, self.event_pb2, self.summary_pb2, (self.tensor_pb2, self.types_pb2) = \
            _writer_parts()
        self.folder = os.fspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.store = store
        self.run_id: int | None = None
        self.writers: dict[int, Any] = {}
        self.step = 0  # the newest step written (rank 0's where it has one)
        self.said: dict[str, str] = {}  # the text summaries last written
        self.points = 0

    def start(self, run_id: int) -> None:
        self.run_id = run_id

    def _many_ranks(self, steps: pd.DataFrame) -> bool:
        if "rank" in steps.columns and (steps["rank"].fillna(0) > 0).any():
            return True
        try:
            return self.store is not None and len(self.store.ranks(self.run_id)) > 1
        except Exception:
            return False

    def _writer(self, rank: int, many: bool) -> Any:
        w = self.writers.get(rank)
        if w is None:
            run = os.path.join(self.folder, f"run-{self.run_id}")
            w = self.writers[rank] = self.Writer(
                os.path.join(run, f"rank-{rank}") if many else run)
        return w

    def _scalars(self, w: Any, step: int, wall: float, figures: dict[str, float]) -> None:
        pb = self.summary_pb2
        summary = pb.Summary(value=[pb.Summary.Value(tag=PREFIX + k, simple_value=v)
                                    for k, v in figures.items()])
        w.add_event(self.event_pb2.Event(wall_time=wall, step=step, summary=summary))
        self.points += 1

    def _text(self, w: Any, tag: str, text: str, step: int, wall: float) -> None:
        pb = self.summary_pb2
        tensor = self.tensor_pb2.TensorProto(dtype=self.types_pb2.DT_STRING,
                                             string_val=[text.encode()])
        meta = pb.SummaryMetadata(plugin_data=pb.SummaryMetadata.PluginData(plugin_name="text"))
        value = pb.Summary.Value(tag=PREFIX + tag, metadata=meta, tensor=tensor)
        w.add_event(self.event_pb2.Event(wall_time=wall, step=step,
                                         summary=pb.Summary(value=[value])))

    def on_rows(self, steps: pd.DataFrame, samples: pd.DataFrame) -> None:
        if steps.empty:
            return
        many = self._many_ranks(steps)
        ranks = steps["rank"].fillna(0).astype(int) if "rank" in steps.columns else \
            pd.Series(0, index=steps.index)
        for rank, g in steps.groupby(ranks):
            g = g.sort_values("ts")
            host = samples
            if not samples.empty and "rank" in samples.columns:
                own = samples[samples["rank"] == rank]
                host = own if not own.empty else samples[samples["rank"].isna()]
            last = g.iloc[-1]
            step, wall = int(last["step"]), float(last["ts"])
            self._scalars(self._writer(int(rank), many), step, wall, window_figures(g, host))
            if int(rank) == 0 or not many:
                self.step = max(self.step, step)
        for w in self.writers.values():
            w.flush()

    def verdict_every(self) -> float:
        return 2.0

    def on_verdict(self, a: Any) -> None:
        if a is None or not self.writers:
            return
        d = a.diagnosis
        texts = {"verdict": f"{d.named}: {d.headline}",
                 "advice": "\n\n".join(f"- {x.param} = {x.value}: {x.reason}"
                                       for x in d.advice) or "none"}
        w = self.writers.get(0) or next(iter(self.writers.values()))
        for tag, text in texts.items():
            if self.said.get(tag) != text:
                self.said[tag] = text
                self._text(w, tag, text, self.step, time.time())
        w.flush()

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
