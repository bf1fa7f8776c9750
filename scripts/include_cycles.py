#!/usr/bin/python3
"""Include cycles among the product's units, where a unit is a .h with its .cc (launcher/agent/agent.h
and launcher/agent/agent.cc are one unit). Unit A depends on unit B when A's .h or .cc includes B's .h.
Prints every cycle (each strongly connected component of more than one unit) and exits 1 if
there is one; exits 0 and prints nothing otherwise. Folders are checked the same way, one level
up: folder A depends on folder B when a unit of A includes a unit of B, and folders in a cycle
(launcher/agent -> launcher/status -> launcher/agent) are reported as "folder launcher/agent", so
the folders of launcher/ stay layers that only include downwards.

  scripts/include_cycles.py [--root DIR] [--list] [--known FILE]

--known FILE: the units known to be in cycles today (one per line, # comments), a ratchet for
the test suite: exit 1 only when a unit outside the list is in a cycle (a new cycle) or a
listed unit is in none any more (take it off the list, so it stays out).

--list prints the unit graph's size and each unit's dependencies instead. Product folders:
common, kernels, launcher, rendezvous, worker (tests/ and bench/ may include anything).
"""
import argparse
import os
import re
import sys

PRODUCT = ("common", "kernels", "launcher", "rendezvous", "worker")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def units(root):
    found = {}
    for top in PRODUCT:
        for here, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                stem, ext = os.path.splitext(name)
                if ext in (".h", ".cc", ".cu", ".cuh"):
                    rel = os.path.relpath(os.path.join(here, stem), root)
                    found.setdefault(rel, []).append(os.path.join(here, name))
    return found


def graph(root, found):
    edges = {u: set() for u in found}
    for unit, paths in found.items():
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as f:
                for inc in INCLUDE.findall(f.read()):
                    other = os.path.splitext(inc)[0]
                    if other in found and other != unit:
                        edges[unit].add(other)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def folder_edges(edges):
    """A program's main (main.cc, *_main.cc) sits above everything it links, so it adds no
    folder dependency."""
    out = {}
    for unit, others in edges.items():
        stem = os.path.basename(unit)
        if stem == "main" or stem.endswith("_main"):
            continue
        here = os.path.dirname(unit)
        out.setdefault(here, set())
        for other in others:
            there = os.path.dirname(other)
            out.setdefault(there, set())
            if there != here:
                out[here].add(there)
    return out


def check_known(found_cycles, known_path):
    with open(known_path, encoding="utf-8") as f:
        known = {line.split("#")[0].strip() for line in f} - {""}
    in_cycles = {unit for component in found_cycles for unit in component}
    new = in_cycles - known
    gone = known - in_cycles
    for component in found_cycles:
        if new & set(component):
            print(f"new include cycle among {len(component)} units: {' '.join(component)} "
                  f"(new: {' '.join(sorted(new & set(component)))})")
    if gone:
        print(f"no longer in an include cycle: {' '.join(sorted(gone))}; take them off "
              f"{known_path} so they stay out")
    return 1 if new or gone else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    p.add_argument("--list", action="store_true")
    p.add_argument("--known")
    args = p.parse_args()
    found = units(args.root)
    edges = graph(args.root, found)
    if args.list:
        print(f"{len(found)} units, {sum(len(v) for v in edges.values())} dependencies")
        for unit in sorted(edges):
            print(f"{unit}: {' '.join(sorted(edges[unit]))}")
        return 0
    found_cycles = cycles(edges) + [["folder " + f for f in component]
                                     for component in cycles(folder_edges(edges))]
    if args.known:
        return check_known(found_cycles, args.known)
    for component in found_cycles:
        print(f"include cycle among {len(component)} units: {' '.join(component)}")
    if found_cycles:
        print(f"{sum(len(c) for c in found_cycles)} units are in include cycles; break each by "
              "moving what both sides need into a unit of its own, or by passing a value or an "
              "interface instead of including the other side", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
