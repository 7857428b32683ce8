"""`nitsum` command line: one subcommand per job, each implemented in its own module."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("nitsum.serve", "start the router and N device workers on a model"),
    "chat": ("nitsum.chat", "answer one chat prompt offline (no server)"),
    "worker": ("nitsum.worker.__main__", "run one device worker (started by `serve`)"),
    "model": ("nitsum.weights.prepare", "model prepare: materialize a model into the cache"),
    "bench": ("nitsum.bench.bench_cli", "replay a trace against an OpenAI-compatible endpoint"),
    "simulate": ("nitsum.simulate", "simulate a cluster with the planner and baselines"),
    "profile": ("nitsum.profiling.profile_cli", "measure a performance profile on local devices"),
}


def usage() -> str:
    lines = ["usage: nitsum <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from nitsum import __version__

        print(f"nitsum {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"nitsum: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
