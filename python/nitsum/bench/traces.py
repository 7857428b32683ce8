"""Request traces: the `TraceRequest` record and loaders for Azure CSV and JSONL files.

A trace is a list of `TraceRequest` sorted by arrival time, with arrivals in seconds relative
to the trace start (the first arrival is at 0). Transformations (window, rate and length
scaling) live in `transform.py`; the synthetic bursty generator in `bursty.py`.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# Short names accepted by `--trace` for the shared Azure 2023 traces.
NAMED_TRACES: dict[str, str] = {
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
}

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    NOTE: `arrival_s` is relative to the trace start; `input_len >= 1` and `output_len >= 1`.
    """

    arrival_s: float
    input_len: int
    output_len: int
    tier: str | None = None


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, the line and what is wrong."""

    def __init__(self, path: str | Path, line: int | None, what: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {what}")
        self.path = str(path)
        self.line = line
        self.what = what


def _parse_count(raw: object, field: str, path: Path, line: int) -> int:
    """A token count: a positive integer (an integral float such as `12.0` is accepted)."""
    if isinstance(raw, bool):
        raise TraceError(path, line, f"{field} must be an integer, got {raw!r}")
    if isinstance(raw, str):
        try:
            raw = int(raw.strip())
        except ValueError:
            raise TraceError(path, line, f"{field} must be an integer, got {raw!r}") from None
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if not isinstance(raw, int):
        raise TraceError(path, line, f"{field} must be an integer, got {raw!r}")
    if raw < 1:
        raise TraceError(path, line, f"{field} must be >= 1, got {raw}")
    return raw


def _parse_azure_timestamp(raw: str, path: Path, line: int) -> tuple[int, float]:
    """`2023-11-16 18:17:03.9799600` → (whole POSIX seconds as if UTC, fraction of a second).

    The two parts are kept apart so that differences keep the 100 ns resolution of the trace
    (a single float of POSIX seconds would round it away).
    """
    text = raw.strip()
    whole, _, frac = text.partition(".")
    try:
        dt = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise TraceError(path, line, f"bad TIMESTAMP {raw!r}") from None
    if frac and not frac.isdigit():
        raise TraceError(path, line, f"bad TIMESTAMP fraction in {raw!r}")
    seconds = int((dt - datetime(1970, 1, 1)).total_seconds())
    return seconds, (int(frac) / 10 ** len(frac)) if frac else 0.0


def _finish(rows: list[tuple[float, int, int, str | None]]) -> list[TraceRequest]:
    """Sort by arrival (stable) and rebase so the first arrival is at 0."""
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    return [TraceRequest(t - t0, i, o, tier) for t, i, o, tier in rows]


def load_azure_csv(path: str | Path) -> list[TraceRequest]:
    """Load an Azure LLM inference trace (columns TIMESTAMP, ContextTokens, GeneratedTokens).

    Raises `TraceError` naming the line of the first malformed row.
    """
    path = Path(path)
    rows: list[tuple[float, int, int, str | None]] = []
    base: int | None = None
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise TraceError(path, 1, "empty file, expected a header line")
        header = [h.strip() for h in header]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise TraceError(path, 1, f"header lacks column(s) {', '.join(missing)}")
        idx = [header.index(c) for c in AZURE_COLUMNS]
        for fields in reader:
            line = reader.line_num
            if not fields or all(not x.strip() for x in fields):
                continue
            if len(fields) != len(header):
                raise TraceError(path, line, f"expected {len(header)} fields, got {len(fields)}")
            secs, frac = _parse_azure_timestamp(fields[idx[0]], path, line)
            if base is None:
                base = secs
            # Seconds since the first row's whole second: small, so the float keeps 100 ns.
            t = (secs - base) + frac
            n_in = _parse_count(fields[idx[1]], "ContextTokens", path, line)
            n_out = _parse_count(fields[idx[2]], "GeneratedTokens", path, line)
            rows.append((t, n_in, n_out, None))
    return _finish(rows)


def load_jsonl(path: str | Path) -> list[TraceRequest]:
    """Load a JSONL trace: one object per line with `timestamp` (seconds, float),
    `input_length`, `output_length` and optionally `tier` (string). Blank lines are skipped.
    """
    path = Path(path)
    rows: list[tuple[float, int, int, str | None]] = []
    with path.open() as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(path, line, f"invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                raise TraceError(path, line, "expected a JSON object")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in obj:
                    raise TraceError(path, line, f"missing field {key!r}")
            ts = obj["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
                raise TraceError(path, line, f"timestamp must be a finite number, got {ts!r}")
            tier = obj.get("tier")
            if tier is not None and (not isinstance(tier, str) or not tier):
                raise TraceError(path, line, f"tier must be a non-empty string, got {tier!r}")
            n_in = _parse_count(obj["input_length"], "input_length", path, line)
            n_out = _parse_count(obj["output_length"], "output_length", path, line)
            rows.append((float(ts), n_in, n_out, tier))
    return _finish(rows)


def default_trace_dir() -> Path:
    """Where `azure-code` / `azure-conv` live: `$NITSUM_TRACE_DIR` if set, else `shared/traces`
    next to the repository (`<repo>/../shared/traces`), found from this file's location
    (`<repo>/python/nitsum/bench/traces.py`) or, failing that, from the working directory.
    """
    env = os.environ.get("NITSUM_TRACE_DIR")
    if env:
        return Path(env)
    candidates = [
        Path(__file__).resolve().parents[3].parent / "shared" / "traces",
        Path.cwd().resolve().parent / "shared" / "traces",
    ]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def load_trace_file(spec: str, trace_dir: Path | None = None) -> list[TraceRequest]:
    """Load `azure-code`, `azure-conv`, or a path ending in `.csv` / `.jsonl`."""
    if spec in NAMED_TRACES:
        path = (trace_dir or default_trace_dir()) / NAMED_TRACES[spec]
        if not path.exists():
            raise TraceError(path, None, f"trace {spec!r} not found (pass --trace PATH)")
        return load_azure_csv(path)
    path = Path(spec)
    if not path.exists():
        raise TraceError(path, None, "no such file")
    if path.suffix == ".csv":
        return load_azure_csv(path)
    if path.suffix in (".jsonl", ".ndjson"):
        return load_jsonl(path)
    raise TraceError(path, None, "unknown trace format (expected .csv or .jsonl)")
