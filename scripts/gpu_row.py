"""One row of gpu_check.sh's table and what a section's run knows to make its rows
(gpu_table.py judges each section; gpu_perf_rows.py the decode and serving ones)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Row:
    section: str
    result: str
    numbers: str
    target: str
    verdict: str
    wall_s: float = 0.0
    budget_s: float = 0.0

    def named(self, section: str) -> Row:
        """This row under another name (one of a section's several rows)."""
        self.section = section
        return self


@dataclass
class SectionRun:
    """What gpu_check.sh knows of one finished section."""

    section: str
    rc: int
    wall_s: float
    budget_s: float
    log: str
    data: dict | None
    gpu: bool

    @property
    def result(self) -> str:
        if self.rc == 127:
            return "MISSING"
        if self.rc in (124, 137):
            return "TIMEOUT"
        return "PASS" if self.rc == 0 else "FAIL"

    def row(self, numbers: str, target: str, met: bool | None, result: str | None = None) -> Row:
        """A row; `met` None: no target applies. Off the GPU every target is n/a."""
        verdict = "n/a" if met is None or not self.gpu else ("pass" if met else "FAIL")
        # A timeout or a failure stays one; `result` may only turn a PASS into a FAIL.
        result = result if result and self.result == "PASS" else self.result
        return Row(
            self.section, result, numbers, target, verdict, self.wall_s,
            self.budget_s,
        )  # fmt: skip


def ms(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def wall_once(rows: list[Row]) -> list[Row]:
    """The rows of one run: its wall time and budget on the first only (counted once)."""
    for row in rows[1:]:
        row.wall_s, row.budget_s = 0.0, 0.0
    return rows
