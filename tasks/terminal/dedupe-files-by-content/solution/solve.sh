#!/bin/bash
set -euo pipefail
cd /app/photos
export LC_ALL=C
: > /app/removed.txt
# "hash<TAB>path" sorted by hash then path; the first path of each hash is kept
find . -type f -printf '%P\0' | sort -z | xargs -0 sha256sum -z -- \
  | tr '\0' '\n' | sed 's/^\([0-9a-f]*\)  /\1\t/' | sort -t $'\t' -k1,1 -k2 -s \
  | awk -F'\t' 'seen[$1]++ {print $2}' | sort > /app/removed.txt
while IFS= read -r f; do rm -f -- "$f"; done < /app/removed.txt
find . -mindepth 1 -type d -empty -delete
