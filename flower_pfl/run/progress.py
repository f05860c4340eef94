"""The console text of a run: one progress line per evaluated round and a closing summary block."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flower_pfl.engine.wording import counted

#: every console line of the package starts with this
PREFIX = "flower-pfl:"


def clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on (``"?"`` when unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def eta(server_round: int, num_rounds: int, elapsed: float) -> float:
    """Seconds left at the pace of the rounds so far (``elapsed`` covers rounds 1..``server_round``)."""
    if server_round <= 0:
        return math.nan
    return elapsed / server_round * max(num_rounds - server_round, 0)


def progress_line(server_round: int, num_rounds: int, row: Mapping[str, Any], elapsed: float, best: float) -> str:
    """One evaluated round: mean accuracy over clients (the papers' figure) with its std, the
    sample-weighted accuracy, the best mean so far, time elapsed and the estimated time left."""
    width = len(str(num_rounds))
    weighted = row.get("accuracy", math.nan)
    return (f"{PREFIX} round {server_round:>{width}}/{num_rounds}  accuracy-mean {row['accuracy-mean']:.4f} "
            f"(std {row.get('accuracy-std', math.nan):.4f}, weighted {weighted:.4f}, best {best:.4f})  "
            f"{clock(elapsed)} elapsed, ETA {clock(eta(server_round, num_rounds, elapsed))}")


def short_round_note(row: Mapping[str, Any], needed: int, clients: int) -> str:
    """What follows an evaluated round's line when it reached too few clients to count."""
    return f"  [{int(row.get('clients-evaluated', 0))} of {clients} clients evaluated, fewer than {needed}: not counted]"


def no_accuracy_line(server_round: int, num_rounds: int, elapsed: float) -> str:
    """An evaluated round in which no client reported a usable accuracy."""
    return f"{PREFIX} round {server_round}/{num_rounds}  no client accuracy (see the warnings above)  {clock(elapsed)} elapsed"


def summary_lines(summary: Mapping[str, Any], out: str | Path) -> list[str]:
    """The closing block of a run from its ``summary.json`` content and results folder."""
    status = summary.get("status", "?")
    rounds, wall = summary.get("num_rounds", "?"), summary.get("wall_time_s", math.nan)
    rounds = counted(rounds, "round") if isinstance(rounds, int) else f"{rounds} rounds"
    per_round = f", {summary['seconds_per_round']:.2f} s/round" if "seconds_per_round" in summary else ""
    if status == "completed":
        lines = [f"{PREFIX} run completed: {rounds} in {clock(wall)}{per_round}"]
    elif status == "degraded":
        why = " and ".join(w for w, n in (("short of clients", summary.get("short_evaluated_rounds", 0)
                                           + summary.get("short_training_rounds", 0)),
                                          ("without an accepted update", summary.get("idle_rounds", 0))) if n)
        lines = [f"{PREFIX} run degraded: {rounds} in {clock(wall)}{per_round}, some of them {why or 'short'}"]
    else:
        lines = [f"{PREFIX} run {status} after {clock(wall)} (of {rounds})"]
    lines += shortfall_lines(summary)
    if "bmta" in summary:
        lines += [
            f"  BMTA           {summary['bmta']:.4f} at round {summary['bmta_round']} "
            f"(sample-weighted {summary['bmta_weighted']:.4f})",
            f"  last-10% mean  {summary['last10_mean_accuracy']:.4f} "
            f"(sample-weighted {summary['last10_mean_accuracy_weighted']:.4f})",
            f"  final          {summary['final_accuracy']:.4f} (std over clients {summary['final_accuracy_std']:.4f})",
        ]
        lines += evaluation_lines(summary)
    if summary.get("error"):
        lines.append(f"  error          {summary['error']}")
    lines.append(f"  results        {out}")
    return lines


def evaluation_lines(summary: Mapping[str, Any]) -> list[str]:
    """The closing block's lines on the reported round (docs/evaluation.md): chosen on validation, its bottom
    decile, the clients that never trained and the rounds to the target accuracy, where the run has them."""
    lines = []
    if "val_selected_round" in summary:
        lines.append(f"  on validation  {summary['val_selected_accuracy']:.4f} at round {summary['val_selected_round']} "
                     f"(sample-weighted {summary['val_selected_accuracy_weighted']:.4f}; BMTA is chosen on test)")
    if "bottom10_accuracy" in summary:
        where = "that round" if "val_selected_round" in summary else "the BMTA round"
        lines.append(f"  bottom decile  {summary['bottom10_accuracy']:.4f} at {where} (10th percentile {summary['p10_accuracy']:.4f})")
    if "unseen_accuracy" in summary:
        lines.append(f"  new clients    {summary['unseen_accuracy']:.4f} over {counted(summary['unseen_clients'], 'client')} "
                     f"that never trained (participation gap {summary['participation_gap']:+.4f})")
    if "rounds_to_target" in summary:
        reached = summary["rounds_to_target"]
        label = f"to {summary['target_accuracy']:g}"
        lines.append(f"  {label:<15}{f'round {reached}' if reached is not None else 'not reached'} (on {summary['rounds_to_target_on']})")
    return lines


def shortfall_lines(summary: Mapping[str, Any]) -> list[str]:
    """The closing block's lines on short rounds (``flower_pfl.run.results.Coverage``) and failing clients
    (``strategies.failures.NodeFailures.summary``)."""
    lines = []
    if n := summary.get("short_evaluated_rounds", 0):
        lines.append(f"  not counted    {n} evaluated round{'s' * (n != 1)} from round {summary['short_evaluated_since']} "
                     f"reached fewer than {summary['min_clients_evaluated']} of {summary['federation_clients']} clients")
    if n := summary.get("short_training_rounds", 0):
        lines.append(f"  short rounds   {n} training round{'s' * (n != 1)} from round {summary['short_training_since']}: "
                     "fewer of the sampled clients replied than min-evaluated-share asks (see clients-failed in metrics.jsonl)")
    if (n := summary.get("idle_rounds", 0)) and "idle_since" in summary:
        lines.append(f"  idle rounds    {n} training round{'s' * (n != 1)} from round {summary['idle_since']} accepted no "
                     "update: every reply was refused or failed (see the warnings in the log)")
    lines += [f"  failures       {line}" for line in summary.get("failures_by_cause", [])]
    if "failures_log" in summary:
        lines.append(f"  failures log   {summary['failures_log']}")
    return lines
