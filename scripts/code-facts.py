#!/usr/bin/env python3
"""Code facts for a renovation note: production lines per crate and for `src/config`, the longest
production functions, and the import graph's cycles between the gateway's top-level modules.

    scripts/code-facts.py            # Markdown on stdout
    scripts/code-facts.py --cycles   # only the cycles; exit status 1 when there is one

Production code is every `.rs` file under a crate's `src/`, less test files (`tests.rs`,
`*_tests.rs`, `test_io.rs`, `testing.rs`) and less each file's `#[cfg(test)]` items (a
`#[cfg(test)]` line and the item after it, counted by braces). Comment and blank lines count as
lines, as `wc -l` would count them. A function is measured from its `fn` line to its closing
brace. An import edge A -> B is any `crate::B` path in a file of module A (`src/A.rs` or
`src/A/...`), where A and B are top-level modules of the gateway crate (`src/lib.rs`'s `mod`s).
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CRATES = {
    "pronto (gateway)": "src",
    "pronto-core": "crates/pronto-core/src",
    "pronto-sim": "crates/pronto-sim/src",
    "pronto-bench": "crates/pronto-bench/src",
    "pronto-tokenizer": "crates/pronto-tokenizer/src",
}
TEST_FILE = re.compile(r"(^tests\.rs$|_tests\.rs$|^test_io\.rs$|^testing\.rs$)")
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def rs_files(src):
    for dirpath, _, names in os.walk(os.path.join(ROOT, src)):
        for n in sorted(names):
            if n.endswith(".rs") and not TEST_FILE.search(n):
                yield os.path.join(dirpath, n)


def strip_strings(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//", 1)[0]


def production_lines(path):
    """The file's lines with its #[cfg(test)] items removed."""
    lines = open(path, encoding="utf-8").read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip().startswith("#[cfg(test)]"):
            depth, seen, j = 0, False, i + 1
            while j < len(lines):
                code = strip_strings(lines[j])
                depth += code.count("{") - code.count("}")
                seen = seen or "{" in code
                if (seen and depth <= 0) or (not seen and code.rstrip().endswith(";")):
                    break
                j += 1
            i = j + 1
            continue
        out.append(lines[i])
        i += 1
    return out


def functions(path, lines):
    rel = os.path.relpath(path, ROOT)
    found = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, seen = 0, False
        for j in range(i, len(lines)):
            code = strip_strings(lines[j])
            depth += code.count("{") - code.count("}")
            seen = seen or "{" in code
            if not seen and code.rstrip().endswith(";"):
                break  # a declaration without a body
            if seen and depth <= 0:
                found.append((j - i + 1, f"{rel}:{i + 1}", m.group(6)))
                break
    return found


def top_modules():
    lib = open(os.path.join(ROOT, "src/lib.rs"), encoding="utf-8").read()
    return re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", lib, re.M)


def import_graph(mods):
    edges = {m: set() for m in mods}
    for path in rs_files("src"):
        rel = os.path.relpath(path, os.path.join(ROOT, "src"))
        first = rel.split(os.sep)[0]
        owner = first[:-3] if first.endswith(".rs") else first
        if owner not in edges:
            continue
        text = "\n".join(production_lines(path))
        for target in re.findall(r"\bcrate::(\w+)", text):
            if target in edges and target != owner:
                edges[owner].add(target)
        # `use crate::{a, b::c}` groups
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text, re.S):
            for target in re.findall(r"(?:^|,)\s*(\w+)", group):
                if target in edges and target != owner:
                    edges[owner].add(target)
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    mods = top_modules()
    cyc = cycles(import_graph(mods))
    if "--cycles" in sys.argv:
        for c in cyc:
            print("cycle: " + " / ".join(c))
        if not cyc:
            print("no import cycle between the gateway's top-level modules")
        sys.exit(1 if cyc else 0)

    print("| crate | production lines | files |")
    print("|---|---:|---:|")
    fns = []
    for name, src in CRATES.items():
        total = files = 0
        for path in rs_files(src):
            lines = production_lines(path)
            total += len(lines)
            files += 1
            fns += functions(path, lines)
        print(f"| {name} | {total} | {files} |")
    cfg = sum(len(production_lines(p)) for p in rs_files("src/config"))
    print(f"| of which `src/config` | {cfg} | |")
    print()
    long = sorted(fns, reverse=True)
    over = [f for f in long if f[0] > 100]
    print(f"Production functions over 100 lines: {len(over)}")
    print()
    print("| lines | function | where |")
    print("|---:|---|---|")
    for n, where, name in long[:20]:
        print(f"| {n} | `{name}` | {where} |")
    print()
    if cyc:
        print(f"Import cycles between the gateway's top-level modules: {len(cyc)}")
        for c in cyc:
            print(f"- {' / '.join(c)}")
    else:
        print("Import cycles between the gateway's top-level modules: none")


if __name__ == "__main__":
    main()
