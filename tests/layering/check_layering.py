#!/usr/bin/env python3
"""tests/layering/check_layering.py - every arrow points down.

Reads the layering table of docs/architecture.md (the rows between <!-- layering:begin --> and
<!-- layering:end -->: | `folder/` | `allowed/`, `other/`, ... |) and every header under
<root>/include/trainkit, and fails when a header includes a trainkit header of a folder its row
does not allow (up or sideways), when a host header (.hpp) includes CUDA code (.cuh), or when a
folder has no row. A header may always include headers of its own folder.

  check_layering.py --table docs/architecture.md --root .            # the library
  check_layering.py --table docs/architecture.md --root tests/layering/fixture   # must fail

Exit status: 0 clean, 1 violations (each printed as file:line: what), 2 bad table or usage.
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]trainkit/([^>"]+)[>"]')
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


def unit_of(rel: str) -> str:
    """The layering unit of a path below include/trainkit: its top folder ('core/') or the file."""
    return rel.split("/", 1)[0] + "/" if "/" in rel else rel


def read_table(path: pathlib.Path) -> dict:
    text = path.read_text(encoding="utf-8")
    try:
        body = text.split("<!-- layering:begin -->", 1)[1].split("<!-- layering:end -->", 1)[0]
    except IndexError:
        sys.exit(f"check_layering: {path}: no <!-- layering:begin --> ... <!-- layering:end --> table")
    table = {}
    for line in body.splitlines():
        m = ROW.match(line.strip())
        if not m:
            continue
        unit, allowed = m.group(1), m.group(2)
        table[unit] = set(re.findall(r"`([^`]+)`", allowed))
    if not table:
        sys.exit(f"check_layering: {path}: the layering table has no rows")
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", required=True, type=pathlib.Path, help="docs/architecture.md")
    ap.add_argument("--root", required=True, type=pathlib.Path, help="folder holding include/trainkit")
    args = ap.parse_args()

    table = read_table(args.table)
    base = args.root / "include" / "trainkit"
    headers = sorted(p for p in base.rglob("*") if p.suffix in (".hpp", ".cuh"))
    if not headers:
        print(f"check_layering: no headers under {base}", file=sys.stderr)
        return 2

    problems = []
    for h in headers:
        rel = h.relative_to(base).as_posix()
        unit = unit_of(rel)
        if unit not in table:
            problems.append(f"{rel}: the folder '{unit}' has no row in the layering table of {args.table}")
            continue
        for n, line in enumerate(h.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            dest = unit_of(target)
            if dest != unit and dest not in table[unit]:
                problems.append(f"{rel}:{n}: includes trainkit/{target}, but {unit} may include only "
                                f"{', '.join(sorted(table[unit])) or 'nothing'} (besides itself)")
            if h.suffix == ".hpp" and target.endswith(".cuh"):
                problems.append(f"{rel}:{n}: a host header includes CUDA code trainkit/{target}")

    for p in problems:
        print(p)
    print(f"layering: {len(headers)} headers, {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
