"""Run every benchmark in turn (``make bench``); each prints its own table of ratios."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = ["lease_exec.py", "episode_overhead.py", "policy.py", "cad_image.py"]


def main() -> int:
    failed = []
    for name in BENCHES:
        path = HERE / name
        if not path.exists():
            continue
        print(f"\n== bench/{name} ==", flush=True)
        if subprocess.run([sys.executable, str(path), *sys.argv[1:]]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
