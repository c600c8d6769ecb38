"""The input straggler: in a distributed job, one rank (or a few) whose loader is slower holds
every other rank in the gradient all-reduce. The slow rank waits for data; the others wait
for it inside the collective, which their probes see as compute. So the signal is a rank's
data wait per step standing out from the median of the other ranks'.

    straggler r  <=>  w_r >= STRAGGLER_RATIO x m_r  and  w_r - m_r >= STRAGGLER_MIN_S

where w_r is rank r's mean data wait per step and m_r the median of the other ranks' (a
lone rank never straggles). Fixing it gives the job back, per step, about w_r - m_r: the
predicted job throughput is the current one times step / (step - (w_r - m_r)), and never more
than the slow rank's own predicted throughput times the world size.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from monitor.diagnosis.features import Features
from monitor.diagnosis.finding import Advice, Diagnosis
from monitor.diagnosis.rules import INPUT_STRAGGLER, gain
from monitor.thresholds import STRAGGLER_MIN_S, STRAGGLER_RATIO


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank's share of a job's window (the `ranks` list of every JSON)."""

    rank: int
    host: str | None
    steps: int
    throughput: float
    data_wait_share: float
    wait_per_step_s: float
    compute_per_step_s: float
    workers: int | None
    workers_cpu_cores: float | None = None  # the rank's DataLoader workers
    workers_memory_mb: float | None = None  # main RSS + workers' USS, mean
    gpu: int | None = None  # the NVML index of the rank's CUDA device, when known

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def stragglers(wait: dict[int, float]) -> list[int]:
    """Ranks whose wait per step stands out from the other ranks' median, worst first."""
    if len(wait) < 2:
        return []
    out = []
    for r, w in wait.items():
        others = statistics.median(v for k, v in wait.items() if k != r)
        if w >= STRAGGLER_RATIO * others and w - others >= STRAGGLER_MIN_S:
            out.append(r)
    return sorted(out, key=lambda r: -wait[r])


def straggler_diagnosis(job: Features, per_rank: dict[int, Features],
                        own: dict[int, Diagnosis], slow: list[int]) -> Diagnosis:
    """The verdict naming the slow rank(s), with the slow rank's loader advice restated as a
    job prediction."""
    wait = {r: f.wait_per_step_s for r, f in per_rank.items()}
    worst = slow[0]
    others = statistics.median(v for k, v in wait.items() if k != worst)
    excess = wait[worst] - others
    step = statistics.median(f.wait_per_step_s + f.compute_per_step_s
                             for f in per_rank.values())
    pred_job = job.throughput * step / max(step - excess, 1e-9)
    lead = (f"Input straggler: rank {worst}" if len(slow) == 1 else
            "Input stragglers: ranks " + ", ".join(map(str, slow)) + f"; rank {worst}")
    headline = (f"{lead} waits {wait[worst] * 1000:.0f} ms "
                f"per step for data (median of the other ranks: {others * 1000:.0f} ms); the "
                f"other ranks' compute includes ~{excess * 1000:.0f} ms waiting for it in "
                "the all-reduce.")
    advice: list[Advice] = []
    for a in own[worst].advice:
        if a.param == "num_workers" and a.predicted_throughput:
            pred = min(pred_job, a.predicted_throughput * len(per_rank))
            advice.append(Advice(a.param, a.value, pred, (
                f"rank {worst}: {a.reason.split(':')[0]}: predicted job throughput "
                f"{pred:,.0f} samples/s, {gain(pred, job.throughput)}")))
        else:
            advice.append(Advice(a.param, a.value, a.predicted_throughput,
                                 f"rank {worst}: {a.reason}"))
    if not advice:
        advice.append(Advice("dataset", "balance the ranks' input", pred_job, (
            f"rank {worst} loads its share slower than the others (storage, a hot shard, "
            f"a busier host): even it out for up to {gain(pred_job, job.throughput)}")))
    bound = {"throughput": job.throughput, "limit": f"rank {worst}'s loader",
             "text": f"now {job.throughput:,.0f} samples/s for the job; limit: rank {worst}'s "
                     f"loader; without its excess wait: {pred_job:,.0f}",
             "predicted_now": None}
    return Diagnosis(INPUT_STRAGGLER, headline, bound, tuple(advice))
