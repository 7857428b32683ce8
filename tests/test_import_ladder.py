"""The package's import graph is a ladder: every `nitsum` import (module level, lazy or
TYPE_CHECKING alike) goes to the same floor or one below, and no modules import each other
in a cycle. docs/architecture.md draws the floors. The kernels package (kernels/nitsum_kernels,
installed beside nitsum) is the floor below them all: it imports nothing of `nitsum`."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "python" / "nitsum"
KERNELS = REPO / "kernels" / "nitsum_kernels"
# Where each top-level package's source lives (the directory holding it).
SOURCES = {"nitsum": ROOT.parent, "nitsum_kernels": KERNELS.parent}

# Lowest first. A module's floor is that of its top-level name under `nitsum`.
FLOORS: list[set[str]] = [
    # NOTE: `_core` (the Rust extension) imports nothing of the package: a leaf, usable from
    # any floor (the worker's binding cost model, pool/bind_choice.py, calls it).
    {
        "errors",
        "codec",
        "paths",
        "ports",
        "config",
        "sampling",
        "structured",
        "tokenizer",
        "_core",
    },
    {"sampling_processors", "sampling_logprobs"},
    {"weights", "kv"},
    {"parallel"},
    {"models"},
    {"engine"},
    {"pool"},
    {"worker"},
    {
        "llm",
        "chat",
        "serve",
        "serve_binding",
        "serve_commands",
        "serve_devices",
        "serve_flags",
        "serve_kv_sizing",
        "serve_launch_flags",
        "serve_routers",
        "serve_supervise",
        "cli",
        "simulate",
        "bench",
        "profiling",
        "control_profile",
    },
]


def floor_of(module: str) -> int:
    """Floor of a dotted `nitsum...` module name (the package itself is the top floor);
    -1 for the kernels package's modules, below every floor of `nitsum`."""
    parts = module.split(".")
    if parts[0] == "nitsum_kernels":
        return -1
    if len(parts) == 1:
        return len(FLOORS) - 1
    for i, names in enumerate(FLOORS):
        if parts[1] in names:
            return i
    raise AssertionError(f"{module}: on no floor; add its package to FLOORS")


def module_name(path: Path) -> str:
    base = KERNELS.parent if path.is_relative_to(KERNELS) else ROOT.parent
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every `nitsum` or `nitsum_kernels` module `path` imports (`from a import b` counts a.b
    when b is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] in SOURCES}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in SOURCES:
                continue
            src = SOURCES[target.split(".")[0]]
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                known = (src / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    src / Path(*sub.split(".")) / "__init__.py"
                ).exists()
                out.add(sub if known else target)
    return out - {name}


def graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py")) + sorted(KERNELS.rglob("*.py"))
    return {module_name(p): imports_of(p) for p in paths}


def test_no_import_goes_up_a_floor() -> None:
    upward = [
        f"{m} (floor {floor_of(m)}) -> {t} (floor {floor_of(t)})"
        for m, targets in graph().items()
        for t in sorted(targets)
        if floor_of(t) > floor_of(m)
    ]
    assert not upward, "imports going up:\n" + "\n".join(upward)


def test_no_import_cycle() -> None:
    g = graph()
    # A package's __init__ importing its own modules is not a cycle through them.
    edges = {m: {t for t in ts if t in g and not m.startswith(t + ".")} for m, ts in g.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle.extend(path[path.index(t) :] + [m, t] if t in path else [m, t])
                return True
            if t not in state and visit(t, path + [m]):
                return True
        state[m] = 2
        return False

    for m in sorted(edges):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    # The ladder test must be able to fail: models importing the engine is an upward arrow.
    assert floor_of("nitsum.engine.engine") > floor_of("nitsum.models.llama")
    assert floor_of("nitsum.pool.pool_engine") > floor_of("nitsum.engine.engine")
    assert "nitsum.engine.engine" in imports_of(ROOT / "pool" / "kv_move.py")
    # The kernels package sits below nitsum: the model importing it is downward, the reverse up.
    assert "nitsum_kernels.linear" in imports_of(ROOT / "models" / "llama.py")
    assert floor_of("nitsum_kernels.linear") < floor_of("nitsum.errors")


def test_the_kernels_are_their_own_package_beside_nitsum() -> None:
    """kernels/nitsum_kernels is a real folder (no symlink, so lint reads it) and no copy of it
    is left inside nitsum; the graph holds its modules."""
    assert KERNELS.is_dir() and not KERNELS.is_symlink() and not KERNELS.parent.is_symlink()
    assert not (ROOT / "kernels").exists()
    assert "nitsum_kernels.paged_attention_triton" in graph()


def test_the_engine_imports_without_triton() -> None:
    """Triton is imported where its kernels run (CUDA, or tests under its interpreter): a
    CPU install without it still builds engines."""
    import subprocess
    import sys

    code = "import sys; sys.modules['triton'] = None; import nitsum.engine.build, nitsum.pool.local"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
