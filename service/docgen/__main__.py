"""``python -m service.docgen [--out DIR] [--check]``: (re)generate ``tasks/document``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from service.docgen.tasks import build_all
from service.docgen.write import differences, suite_files, write_suite

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "tasks" / "document"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the generated suite; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m service.docgen", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="suite folder")
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    files = suite_files(build_all())
    if args.check:
        problems = differences(args.out, files)
        for line in problems:
            print(line)
        print(f"{len(files)} files, {len(problems)} differences")
        return 1 if problems else 0
    changed = write_suite(args.out, files)
    extra = [p for p in differences(args.out, files) if p.endswith("not generated")]
    print(f"{len(files)} files in {args.out}, {len(changed)} written")
    for line in extra:
        print(f"warning: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
