#!/bin/bash
# Oracle: build the part with Blender's Python API (build.py beside this script) and export it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! blender -b --factory-startup --python-exit-code 1 --python "$here/build.py" >/tmp/oracle-blender.log 2>&1; then
  cat /tmp/oracle-blender.log
  exit 1
fi
test -s /app/out/plate.stl
