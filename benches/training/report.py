"""Medians over rounds, the Markdown table of docs/benchmarks.md, and whether creditflow meets
its goals against the best peer."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benches.training.contenders import PEERS

MiB = 1 << 20


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's rounds -> medians of each figure (over the rounds that succeeded), the
    rounds' count, and the first error seen."""
    good = [t for t in trials if "error" not in t]
    bad = [t for t in trials if "error" in t]
    out: dict[str, Any] = {"rounds": len(trials), "ok_rounds": len(good)}
    if bad:
        out["error"] = bad[0]["error"]
        out["phase"] = bad[0].get("phase")
        out["traceback"] = bad[0].get("traceback")
    if not good:
        return out
    for key in ("first_batch", "total", "prepare", "cpu", "write_bytes", "cancelled_write_bytes", "peak_dir"):
        out[key] = median([t.get(key) for t in good])
    epochs = min(len(t["epochs"]) for t in good)
    out["epochs"] = [median([t["epochs"][i] for t in good]) for i in range(epochs)]
    ranks = len(good[0]["rss"])
    out["rss"] = [median([t["rss"][r] for t in good]) for r in range(ranks)]
    out["rss_ready"] = [median([t["rss_ready"][r] for t in good]) for r in range(ranks)]
    out["batches"] = good[0]["batches"]
    out["batches_vary"] = any(t["batches"] != good[0]["batches"] for t in good)
    out["rows"] = good[0]["rows"]
    out["each_row_once"] = all(all(t["keys_ok"]) for t in good)
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _mb(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 1e6:
        return "0" if v == 0 else f"{v / 1e3:.0f} kB"
    return f"{v / 1e6:.1f} MB"


def _batches(s: dict[str, Any]) -> str:
    text = " · ".join("/".join(str(b) for b in rank) for rank in s["batches"])
    return text + (" (varies by round)" if s["batches_vary"] else "")


def _rows(s: dict[str, Any], expected_rows: int) -> str:
    if s["each_row_once"]:
        return "each row once"
    return "/".join(f"{r:,}" for r in s["rows"]) + f" of {expected_rows:,}, not each once"


def table(summaries: dict[str, dict[str, Any]], expected_rows: int) -> str:
    """The figures as one Markdown table (a contender that never ran shows its error)."""
    head = (
        "| contender | first batch (s) | epoch 0 / 1 / 2 (s) | total (s) | materialized (s) | CPU (s) "
        "| written to disk | peak on disk | peak RSS rank 0 / 1 (MiB) | batches per rank per epoch "
        "| rows per epoch |"
    )
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for name, s in summaries.items():
        if not s["ok_rounds"]:
            lines.append(f"| {name} | failed: see below |" + " |" * 10)
            continue
        rss = " / ".join(f"{r / MiB:.0f}" for r in s["rss"])
        epochs = " / ".join(_s(e) for e in s["epochs"])
        cells = [
            name + ("" if s["ok_rounds"] == s["rounds"] else f" ({s['ok_rounds']} of {s['rounds']} rounds)"),
            _s(s["first_batch"]),
            epochs,
            _s(s["total"]),
            _s(s["prepare"]),
            f"{s['cpu']:.0f}",
            _mb(s["write_bytes"]),
            _mb(s["peak_dir"]),
            rss,
            _batches(s),
            _rows(s, expected_rows),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def errors(summaries: dict[str, dict[str, Any]]) -> str:
    """One line per contender that failed in some round: the phase and the exception text."""
    out = []
    for name, s in summaries.items():
        if "error" in s:
            failed = s["rounds"] - s["ok_rounds"]
            text = " ".join(s["error"].split())
            if len(text) > 700:  # a Spark worker's traceback: its start and its last lines
                text = text[:250] + " ... " + text[-400:]
            out.append(f"- **{name}** ({failed} of {s['rounds']} rounds, in {s['phase']}): `{text}`")
    return "\n".join(out)


def paired(trials: dict[str, list[dict[str, Any]]], contender: str, key: str, better: str) -> float | None:
    """The median over rounds of ``contender``'s ``key`` against the best peer's in the same
    round (the lowest value: ``better`` ``"peer/me"`` gives peer / contender, ``"me/peer"``
    contender / peer); rounds where the contender or every peer failed are left out."""
    mine = {t["round"]: t[key] for t in trials.get(contender, []) if "error" not in t}
    ratios = []
    for r, value in mine.items():
        theirs = [
            t[key]
            for n, ts in trials.items()
            if n in PEERS
            for t in ts
            if t["round"] == r and "error" not in t
        ]
        if theirs and value:
            best = min(theirs)
            ratios.append(best / value if better == "peer/me" else value / best)
    return statistics.median(ratios) if ratios else None


def goals(
    summaries: dict[str, dict[str, Any]],
    trials: dict[str, list[dict[str, Any]]],
    contender: str = "creditflow",
) -> str:
    """``contender``'s goals against the best peer that ran: the first batch at least 10x sooner,
    3 epochs in at most half the time (each the median of the rounds' ratios against the round's
    best peer), and no data on disk when the stream fits in memory."""
    me = summaries.get(contender)
    peers = {n: s for n, s in summaries.items() if n in PEERS and s["ok_rounds"]}
    if not me or not me["ok_rounds"]:
        return f"Goals: not measured ({contender} did not run)."
    if not peers:
        return "Goals: not measured (no peer ran)."
    first_x = paired(trials, contender, "first_batch", "peer/me")
    total_x = paired(trials, contender, "total", "me/peer")
    if first_x is None or total_x is None:
        return "Goals: not measured (no round where both it and a peer ran)."
    written, peak = me["write_bytes"], me["peak_dir"]
    # Creating and removing empty files (lock files, temp files) dirties a few kB of
    # file-system metadata: "zero" means no data on disk, not a count of exactly 0.
    zero = peak == 0 and written < 1e6
    return "\n".join(
        [
            f"- first batch {first_x:.1f}x sooner than the round's best peer (median of the rounds): "
            f"{'met' if first_x >= 10 else 'missed'} (goal >= 10x)",
            f"- 3 epochs in {total_x:.2f}x the round's best peer's total (median of the rounds): "
            f"{'met' if total_x <= 0.5 else 'missed'} (goal <= 0.5x)",
            f"- on disk: peak {_mb(peak)}, written {_mb(written)} "
            f"({'met' if zero else 'missed'}: goal no data on disk when it fits in memory)",
        ]
    )
