"""The evidence of each gpu_check.sh run, from the device's $OUT to docs/gpu/runs/ and docs/gpu.md.

gpu_runs.py pack WORKDIR OUT --head LINE --device D
    (gpu_check.sh, at the end of a run) everything the run wrote that a reader needs, in
    `OUT/run.tar.gz` (meta.json, the table, rows.jsonl, logs.txt, each section's JSON,
    the served loads' step logs and server logs), beside `OUT/gpu_check.md` (the table):
    two files, within the device tool's 8 files of 16 MiB;
gpu_runs.py unpack OUT [--runs DIR] [--force]
    (here, after the call) the archive into `docs/gpu/runs/<date>-<device>/`, then render;
gpu_runs.py render [--check]
    the generated runs section of docs/gpu.md from every run directory (gpu_runs_doc.py);
    `--check`: exit 1 if docs/gpu.md is not in step with them (tests/test_gpu_runs.py).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import gpu_runs_doc  # scripts/ is on the path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "docs" / "gpu" / "runs"
DOC = ROOT / "docs" / "gpu.md"
ARCHIVE = "run.tar.gz"
MAX_FILE = 16 << 20  # the device tool's limit on one file brought back
SCHEMA = "nitsum-gpu-run/1"
# What a work dir holds that belongs in the evidence: never the model, caches or wheels, nor
# the sections' own logs (logs.txt has them all).
KEEP = re.compile(
    r"^(rows\.jsonl|logs\.txt|gpu_check\.md|[a-z0-9_-]+\.jsonl?|[a-z0-9_]+-server\.log)$"
)
# Dropped first when the archive would pass MAX_FILE: the bulkiest, least read files.
EXPENDABLE = re.compile(r"(-steps\.jsonl|-server\.log)$")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "?"


def run_meta(head: str, device: str, files: list[str]) -> dict:
    """What identifies a run: when, where, which tree; `dry_run` unless it ran on CUDA."""
    gpu = re.search(r" on \S+ \((.*?)\), commit", head)
    return {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "time": time.strftime("%H:%MZ", time.gmtime()),
        "device": device,
        "gpu": gpu.group(1) if gpu else "?",
        "commit": _git("rev-parse", "--short", "HEAD"),
        "tree_dirty": _git("status", "--porcelain", "--untracked-files=no") not in ("", "?"),
        "dry_run": not device.startswith("cuda"),
        "head": head,
        "files": files,
    }


def _archive(work: Path, names: list[str], meta: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in names:
            tar.add(work / name, arcname=name)
        data = (json.dumps(meta, indent=1) + "\n").encode()
        info = tarfile.TarInfo("meta.json")
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack(work: Path, out: Path, head: str, device: str) -> Path:
    """`out/run.tar.gz` of the run in `work` (and `out/gpu_check.md`); returns the archive.
    NOTE: over MAX_FILE, the step and server logs are left out, largest first, and meta.json
    lists them under `left_out`."""
    names = sorted(p.name for p in work.iterdir() if p.is_file() and KEEP.match(p.name))
    left_out: list[str] = []
    meta = run_meta(head, device, names)
    blob = _archive(work, names, meta)
    spare = sorted(
        (n for n in names if EXPENDABLE.search(n)), key=lambda n: (work / n).stat().st_size
    )
    while len(blob) > MAX_FILE and spare:
        drop = spare.pop()
        names.remove(drop)
        left_out.append(drop)
        blob = _archive(work, names, meta | {"files": names, "left_out": left_out})
    out.mkdir(parents=True, exist_ok=True)
    (out / ARCHIVE).write_bytes(blob)
    if (work / "gpu_check.md").is_file():
        (out / "gpu_check.md").write_bytes((work / "gpu_check.md").read_bytes())
    return out / ARCHIVE


def run_name(meta: dict) -> str:
    """`<date>-<device>`: `2026-11-29-nvidia-h200`, or `2026-11-29-cpu-dry-run`."""
    what = "cpu-dry-run" if meta["dry_run"] else re.sub(r"[^a-z0-9]+", "-", meta["gpu"].lower())
    return f"{meta['date']}-{what.strip('-')}"


def unpack(out: Path, runs: Path = RUNS, force: bool = False) -> Path:
    """The archive in `out` (a returned $OUT) as a run directory under `runs`; returns it.
    Refuses an archive without meta.json or with paths that leave the directory, and a run
    unpacked already unless `force`; another run of the same day goes to `<name>-2`."""
    with tarfile.open(out / ARCHIVE) as tar:
        members = tar.getmembers()
        bad = [m.name for m in members if not m.isfile() or "/" in m.name or m.name.startswith(".")]
        if bad:
            raise ValueError(f"{out / ARCHIVE}: unexpected members {bad}")
        files = {m.name: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]
    if "meta.json" not in files:
        raise ValueError(f"{out / ARCHIVE}: no meta.json (not a gpu_check.sh archive)")
    meta = json.loads(files["meta.json"])
    if meta.get("schema") != SCHEMA:
        raise ValueError(f"{out / ARCHIVE}: schema {meta.get('schema')!r}, not {SCHEMA}")
    target = runs / run_name(meta)
    for n in range(2, 100):
        if not target.exists() or force:
            break
        if (target / "meta.json").is_file() and json.loads(
            (target / "meta.json").read_text()
        ) == meta:
            raise FileExistsError(f"{target} holds this run already (--force rewrites it)")
        target = runs / f"{run_name(meta)}-{n}"  # NOTE: a second run of the same day
    target.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (target / name).write_bytes(data)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("work", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--head", required=True)
    p.add_argument("--device", required=True)
    u = sub.add_parser("unpack")
    u.add_argument("out", type=Path)
    u.add_argument("--runs", type=Path, default=RUNS)
    u.add_argument("--force", action="store_true")
    r = sub.add_parser("render")
    r.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        path = pack(args.work, args.out, args.head, args.device)
        print(f"{path}: {path.stat().st_size / 1e3:.0f} kB")
        return 0
    if args.cmd == "unpack":
        print(unpack(args.out, args.runs, args.force))
        if args.runs != RUNS:
            return 0
    text = DOC.read_text()
    new = gpu_runs_doc.with_runs(text, RUNS)
    if args.cmd == "render" and args.check:
        if new != text:
            print("docs/gpu.md is not in step with docs/gpu/runs/: run gpu_runs.py render")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
