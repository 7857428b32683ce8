"""The router crate's module graph is a ladder too: every `crate::`/`super::`/`self::` path
in `scheduler-rs/src` (in `use` or in an expression) goes to the same floor or one below,
and no modules reach each other in a cycle. docs/architecture.md draws the floors.

What counts:
- A module is a file: `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` is the crate root
  (`crate`), and the `nitsum-router` binary's `main.rs` (which reaches the library as
  `nitsum_scheduler::`) is `main`.
- A path names the longest module prefix that is a file (`crate::a::b::C` is `a::b` when
  `a/b.rs` exists, else `a`). `super::` and `self::` resolve from the module they sit in
  (inside an inline `mod x { .. }`, one level deeper), and a bare `use child::..` from a
  parent names its child.
- A parent declaring `mod child;` is not an arrow; a parent that uses its child (a `pub use`
  facade) is one, so a child calling back into its parent's `mod.rs` closes a cycle.
- Test code is left out: `#[cfg(test)] mod x;` files and inline `#[cfg(test)] mod x { .. }`
  blocks. It is not in the built library, nothing but its parent's `mod` declaration names
  it (so it can close no cycle), and a test may assemble fixtures from any floor.
- Comments, doc links and string literals are not code.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "scheduler-rs" / "src"

# Lowest first. A module's floor is that of its top-level name (`a` for `a::b`); `crate`
# (lib.rs: the version and the health answer) imports nothing.
FLOORS: list[set[str]] = [
    {
        "crate",
        "ids",
        "fasthash",
        "heap",
        "tiers",
        "profile",
        "stats",
        "errors",
        "tokenize",
        "testutil",
    },
    {"plan", "prefix_index", "worker_auth", "binding", "lease", "parsers"},
    {"protocols", "dispatch", "planner", "metrics"},
    {"sim", "registry", "mock_worker"},
    {"config"},
    {"state", "auth"},
    {"control_loop", "transport", "api", "routers"},
    {"server"},
    {"main", "python"},
]


def floor_of(module: str) -> int:
    """Floor of a `a::b` module name."""
    top = module.split("::")[0]
    for i, names in enumerate(FLOORS):
        if top in names:
            return i
    raise AssertionError(f"{module}: on no floor; add it to FLOORS")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], []):
        return "crate"
    return "::".join(parts)


def is_module(module: list[str]) -> bool:
    """Whether `a::b` names a file of the crate (`a/b.rs` or `a/b/mod.rs`)."""
    base = SRC.joinpath(*module) if module else SRC
    return module == [] or base.with_suffix(".rs").exists() or (base / "mod.rs").exists()


def code_only(text: str) -> str:
    """`text` with comments, string and char literals blanked (lengths kept)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j, depth = i + 2, 1
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
        elif m := re.compile(r'b?r(#*)"').match(text, i):
            j = text.find('"' + m.group(1), m.end()) + 1 + len(m.group(1))
        elif c == '"' or text.startswith('b"', i):
            j = i + (2 if c == "b" else 1)
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        elif m := re.compile(r"b?'(\\.[^']*|[^\\'])'").match(text, i):
            j = m.end()
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def block_end(text: str, open_brace: int) -> int:
    """Index just past the `}` matching the `{` at `open_brace`."""
    depth = 0
    for j in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    raise AssertionError("unbalanced braces")


def expand_use(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> `a::b`, `a::c::d`, `a::c::e` (renames and globs dropped)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    brace = tree.find("{")
    if brace < 0:
        return [tree.removesuffix("::*")]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    items, depth, start = [], 0, 0
    for j, ch in enumerate(inner + ","):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            if inner[start:j]:
                items.append(inner[start:j])
            start = j + 1
    return [p for item in items for p in expand_use(prefix + item)]


def resolve(path: list[str], here: list[str]) -> str | None:
    """The module a path from inside module `here` names (None: outside the crate)."""
    head, rest = path[0], path[1:]
    if head == "crate":
        base = []
    elif head in ("super", "self"):
        base = list(here)
        while head in ("super", "self"):
            if head == "super":
                base = base[:-1]
            head, rest = rest[0] if rest else "", rest[1:]
        rest = [head, *rest] if head else rest
    elif is_module([*here, head]):
        base, rest = list(here), path
    else:
        return None
    for k in range(len(rest), -1, -1):
        if is_module(base + rest[:k]):
            return "::".join(base + rest[:k]) or "crate"
    return None


def cfg_test_files(path: Path) -> set[Path]:
    """Files that `path` declares as `#[cfg(test)] mod x;` (`#[path = ".."]` honoured)."""
    inside = path.parent if path.stem in ("mod", "lib", "main") else path.parent / path.stem
    out: set[Path] = set()
    decl = (
        r"#\[cfg\(test\)\]\s*(?:#\[path\s*=\s*\"([^\"]+)\"\]\s*)?"
        r"(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*;"
    )
    for file, name in re.findall(decl, path.read_text()):
        out |= {path.parent / file} if file else {inside / f"{name}.rs", inside / name / "mod.rs"}
    return out


def arrows_of(path: Path) -> set[str]:
    """Every crate module the (non-test) code of `path` names."""
    name = module_of(path)
    file_mod = [] if name in ("crate", "main") else name.split("::")
    text = code_only(path.read_text())
    if name == "main":
        text = text.replace("nitsum_scheduler::", "crate::")
    # Inline modules: test ones are dropped, others shift `super::`/`self::` one level.
    spans: list[tuple[int, int]] = []
    for m in re.finditer(r"(#\[cfg\(test\)\]\s*)?\bmod\s+(\w+)\s*\{", text):
        end = block_end(text, m.end() - 1)
        if m.group(1):
            text = text[: m.start()] + re.sub(r"[^\n]", " ", text[m.start() : end]) + text[end:]
        else:
            spans.append((m.end(), end))
    out: set[str] = set()
    paths: list[tuple[int, str]] = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths += [(m.start(), p) for p in expand_use(m.group(1))]
        text = text[: m.start()] + " " * (m.end() - m.start()) + text[m.end() :]
    # In expressions: `crate::..`, `super::..`, `self::..` and a child's bare `child::..`.
    for m in re.finditer(r"(?<![\w:])(\w+)((?:::\w+)+)", text):
        if m.group(1) in ("crate", "super", "self") or is_module([*file_mod, m.group(1)]):
            paths.append((m.start(), m.group(0)))
    for at, p in paths:
        inline = ["<inline>" for s, e in spans if s <= at < e]
        target = resolve(p.split("::"), file_mod + inline)
        if target is not None and "<inline>" not in target:
            out.add(target)
    return out - {name}


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module -> the modules its non-test code names."""
    files = sorted(SRC.rglob("*.rs"))
    tests = {t for f in files for t in cfg_test_files(f)}
    return {module_of(f): arrows_of(f) for f in files if f not in tests}


def upward(g: dict[str, set[str]]) -> list[str]:
    """Every arrow of `g` to a higher floor, as `from (floor) -> to (floor)`."""
    return [
        f"{m} (floor {floor_of(m)}) -> {t} (floor {floor_of(t)})"
        for m, targets in g.items()
        for t in sorted(targets)
        if floor_of(t) > floor_of(m)
    ]


def test_no_module_path_goes_up_a_floor() -> None:
    found = upward(graph())
    assert not found, "paths going up:\n" + "\n".join(found)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted.

    NOTE: a module naming its own descendants (a `mod.rs` re-exporting its children) is
    not an arrow here, as a Python package's `__init__` importing its modules is not: the
    children may use what their parent defines."""
    edges = {
        m: sorted(t for t in ts if t in g and not t.startswith(m + "::")) for m, ts in g.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in edges[m]:
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == m:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return out


def test_no_module_cycle() -> None:
    found = cycles(graph())
    assert not found, "modules in a cycle:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_cycles_and_upward_paths() -> None:
    # The ladder test must be able to fail: the parser finds real arrows, both checks flag
    # a bad one, and a parent's facade over its children is no cycle.
    g = graph()
    assert "planner" in g["sim::cluster"] and "dispatch" in g["sim::cluster"]
    assert "sim::reqs" in g["sim::group"] and "state" in g["transport"]
    assert (
        "errors" in g["state::submit_error"] and "protocols::extensions" in g["protocols::openai"]
    )
    assert floor_of("state::rounds") > floor_of("sim::chooser") > floor_of("planner::fresh")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a::b"}, "a::b": {"a"}}) == []
    bad = {**g, "planner::score": g["planner::score"] | {"planner::fresh"}}
    assert cycles(bad) == [["planner::fresh", "planner::score"]]
    assert upward(g) == []
    assert upward({**g, "errors": {"state"}}) == ["errors (floor 0) -> state (floor 5)"]


def test_the_parser_reads_use_trees_super_and_comments() -> None:
    assert expand_use("crate::a::{b, c::{D, E as F}, self}") == [
        "crate::a::b",
        "crate::a::c::D",
        "crate::a::c::E",
        "crate::a::self",
    ]
    text = 'let s = "crate::x"; // crate::y\n/* crate::z */ let c = \'"\'; crate::w::f();'
    blanked = code_only(text)
    assert "crate::w::f" in blanked and "crate::x" not in blanked
    assert "crate::y" not in blanked and "crate::z" not in blanked
    assert resolve(["super", "reqs", "Req"], ["sim", "group"]) == "sim::reqs"
    assert (
        resolve(["crate", "planner", "strategy", "Strategy"], ["sim", "cluster"])
        == "planner::strategy"
    )
    assert resolve(["crate", "sim", "Policy"], ["control"]) == "sim"
    assert resolve(["serde", "Serialize"], ["sim"]) is None
