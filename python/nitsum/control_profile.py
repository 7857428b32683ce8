"""Which performance profile turns on the router's control loop for `nitsum serve`.

The control loop (the planner every control window: TP levels, roles, prefill/decode split,
tiers per group) needs a profile that describes the served model on the serving device
(docs/profile-schema.md). `nitsum serve` turns it on by default with a measured profile found
for the model: `./profiles` first (where `nitsum profile` writes), then the repository's
`profiles/` (the shipped `cpu-2core-SmolLM2-135M-Instruct.json` for the embedded model). A
model no profile describes runs with the static plan (every worker its own TP-1 mixed group)
and a warning that says how to get one; never with another model's profile.

`choose_control_profile` only decides and explains; `nitsum serve` passes the path to the
router (`--profile`) and logs the messages.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nitsum
from nitsum.config import tp_level_problem

# The repository's profiles/ (source checkout or editable install: python/nitsum/../../profiles).
SHIPPED_PROFILES = Path(nitsum.__file__).resolve().parents[2] / "profiles"


class ControlConfigError(ValueError):
    """Flags or config that contradict each other; the message says which."""


@dataclass(frozen=True)
class ControlChoice:
    """The outcome: a profile to pass to the router, and what to tell the user.

    `profile` None with `control` True means the router takes the profile named in `--config`.
    """

    control: bool
    profile: Path | None
    messages: list[tuple[int, str]] = field(default_factory=list)  # (logging level, text)


def profile_dirs(cwd: Path | None = None) -> list[Path]:
    """Where profiles are searched, in order: `./profiles`, then the shipped ones."""
    dirs: list[Path] = []
    for d in ((cwd or Path.cwd()) / "profiles", SHIPPED_PROFILES):
        if d.is_dir() and all(d.resolve() != o.resolve() for o in dirs):
            dirs.append(d)
    return dirs


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mismatch(profile: dict, model_dir: Path) -> str | None:
    """Why `profile` does not describe the model in `model_dir` (None: it does).

    The profile names the model by its directory name (`nitsum profile` writes
    `model_dir.name`); the context window and the TP levels must fit the model too.
    """
    name = profile.get("model")
    if name != model_dir.name:
        return f"it profiles {name!r}, not {model_dir.name!r}"
    cfg = read_json(model_dir / "config.json") or {}
    window = cfg.get("max_position_embeddings")
    max_context = profile.get("max_context")
    if max_context is not None and window is not None and int(max_context) != int(window):
        return f"its context window {max_context} is not the model's {window}"
    # NOTE: an absent intermediate size (0) divides by every level: only the heads decide.
    heads, inter = cfg.get("num_attention_heads"), cfg.get("intermediate_size", 0)
    kv = cfg.get("num_key_value_heads") or heads
    if isinstance(kv, int) and isinstance(heads, int) and isinstance(inter, int):
        levels = [int(t) for t in profile.get("tp_levels", [])]
        bad = [t for t in levels if tp_level_problem(kv, heads, inter, t)]
        if bad:
            why = tp_level_problem(kv, heads, inter, bad[0])
            return f"the model cannot run its TP levels {bad}: {why}"
    return None


def find_profile(model_dir: Path, dirs: Sequence[Path]) -> Path | None:
    """A measured CPU profile of this model: this host's core count first, then any CPU one."""
    host = f"cpu-{os.cpu_count()}core"
    found: list[tuple[int, int, Path]] = []
    for order, d in enumerate(dirs):
        for path in sorted(d.glob("*.json")):
            p = read_json(path)
            if p is None or p.get("analytic") or not str(p.get("device", "")).startswith("cpu"):
                continue
            if mismatch(p, model_dir) is None:
                found.append((p.get("device") != host, order, path))
    return min(found)[2] if found else None


def config_profile(config: str | None) -> str | None:
    """The `profile` field of a JSON router config (None when absent or unreadable: the
    router reports a broken config itself)."""
    if not config:
        return None
    data = read_json(Path(config).expanduser())
    value = (data or {}).get("profile")
    return str(value) if value else None


def choose_control_profile(
    model_dir: Path,
    device: str = "cpu",
    profile: str | None = None,
    control: bool = True,
    config: str | None = None,
    dirs: Sequence[Path] | None = None,
) -> ControlChoice:
    """Decide whether `nitsum serve` runs the control loop, and on which profile.

    - `control` False (`--no-control`): static plan; a `--profile` or a config `profile` with it
      is a contradiction (ControlConfigError).
    - `--profile`: used as given; a profile of another model gets a warning, not a refusal.
    - a config that names a profile: the router uses it.
    - otherwise a measured CPU profile of the model from `dirs` (default `profile_dirs()`);
      none (or `--device cuda`, which has no measured profile here): static plan + warning.
    """
    info, warn = logging.INFO, logging.WARNING
    in_config = config_profile(config)
    if not control:
        if profile or in_config:
            where = "--profile" if profile else f"the config's profile ({in_config})"
            raise ControlConfigError(
                f"--no-control contradicts {where}: a profile turns the control loop on"
            )
        return ControlChoice(False, None, [(info, "control loop off (--no-control): static plan")])
    if profile:
        path = Path(profile).expanduser()
        msgs = [(info, f"control loop on: planning every window with {path}")]
        data = read_json(path)
        why = mismatch(data, model_dir) if data is not None else None
        if why:
            msgs.append((warn, f"{path} may not describe {model_dir.name}: {why}"))
        return ControlChoice(True, path, msgs)
    if in_config:
        return ControlChoice(True, None, [(info, f"control loop on: the config's {in_config}")])
    how = (
        f"measure one with `nitsum profile --model {model_dir}` and pass --profile PATH, "
        "or pass --no-control to silence this"
    )
    if device != "cpu":
        msg = f"no measured profile for --device {device}: control loop off (static plan); {how}"
        return ControlChoice(False, None, [(warn, msg)])
    dirs = profile_dirs() if dirs is None else dirs
    found = find_profile(model_dir, dirs)
    if found is None:
        where = ", ".join(str(d) for d in dirs) or "no profiles directory"
        msg = (
            f"no profile in {where} describes {model_dir.name}: control loop off (static "
            f"plan: every worker its own TP-1 mixed group); {how}"
        )
        return ControlChoice(False, None, [(warn, msg)])
    msgs = [(info, f"control loop on: planning every window with {found} (see /admin/plan)")]
    measured_on = (read_json(found) or {}).get("device")
    host = f"cpu-{os.cpu_count()}core"
    if measured_on != host:
        msgs.append(
            (
                info,
                f"{found.name} was measured on {measured_on}, this host is {host}: latency "
                f"estimates may be off; `nitsum profile --model {model_dir}` measures this host",
            )
        )
    return ControlChoice(True, found, msgs)
