"""`nitsum serve`'s per-request TP binding settings for its workers: the profile their binding
cost model weighs with (scheduler-rs binding/, through `nitsum._core.BindingModel`) and the
policy (`cost`: bind only where it pays; `always`: every binding the triggers ask for).

By default the workers weigh with the control profile: the one the router plans with
(`--profile`, a measured one found for the model, or the config's `profile`), so the planner
and the binder agree on what an iteration costs. Without the control loop there is none, and
the workers bind as the triggers ask (docs/serving.md, "Per-request TP binding").
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from nitsum.control_profile import ControlChoice, config_profile

log = logging.getLogger("nitsum.serve")

BIND_POLICIES = ("cost", "always")


def add_binding_flags(p: argparse.ArgumentParser) -> None:
    """`--binding-profile` and `--bind-policy`, forwarded to every worker."""
    p.add_argument(
        "--binding-profile",
        default=None,
        metavar="PATH",
        help="nitsum-profile/1 JSON the workers' binding cost model weighs a binding with "
        "(default: the control profile the router plans with; none with --no-control)",
    )
    p.add_argument(
        "--bind-policy",
        choices=BIND_POLICIES,
        default=None,
        help="cost: bind a request only where the cost model says it pays (needs a profile); "
        "always: every binding the triggers ask for (default: the workers', cost)",
    )


def resolve_binding(args: argparse.Namespace, choice: ControlChoice) -> list[str]:
    """Set `args.binding_profile` to the profile the workers get (the user's, else the
    control profile when the control loop runs); returns errors (empty: fine)."""
    if args.binding_profile is not None:
        path = Path(args.binding_profile).expanduser()
        if not path.is_file():
            return [f"--binding-profile {args.binding_profile}: no such file"]
        if problem := profile_problem(path):
            return [f"--binding-profile {args.binding_profile}: {problem}"]
        args.binding_profile = str(path.resolve())
        return []
    control = (choice.profile or config_profile(args.config)) if choice.control else None
    if control is not None:
        args.binding_profile = str(Path(control).expanduser().resolve())
    elif args.bind_policy == "cost":
        log.warning(
            "--bind-policy cost without a profile (no control loop, no --binding-profile): "
            "the workers cannot weigh bindings and take every one the triggers ask for"
        )
    return []


def profile_problem(path: Path) -> str | None:
    """Why the cost model cannot read the profile at `path` (None: it can), so a bad one is
    refused at start rather than by every worker. NOTE: the control profile is the router's
    to check; this is for a profile only the workers read."""
    try:
        from nitsum._core import BindingModel, Profile
    except ImportError:  # no native module (the router runs as its own binary): unchecked
        return None
    try:
        BindingModel(Profile(path.read_text()))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return str(e)
    return None


def binding_flags(args: argparse.Namespace) -> list[str]:
    """The worker flags for the resolved settings (none: the worker's defaults)."""
    flags = []
    if getattr(args, "binding_profile", None) is not None:
        flags += ["--binding-profile", str(args.binding_profile)]
    if getattr(args, "bind_policy", None) is not None:
        flags += ["--bind-policy", args.bind_policy]
    return flags
