#!/bin/bash
set -euo pipefail
export LC_ALL=C
work=/app/extracted
rm -rf "$work"; mkdir -p "$work"
cp /app/incoming/delivery.tar.gz "$work/"
# keep unpacking until no archive is left; each archive is extracted next to itself
while true; do
  found=0
  while IFS= read -r -d '' a; do
    found=1
    d="${a}.d"; mkdir -p "$d"
    case "$a" in
      *.zip) unzip -q -o "$a" -d "$d" ;;
      *.tar|*.tar.gz|*.tgz|*.tar.bz2|*.tar.xz) tar -xf "$a" -C "$d" ;;
      *.gz) gunzip -c "$a" > "${a%.gz}"; rmdir "$d" ;;
    esac
    rm -f "$a"
  done < <(find "$work" -type f \( -name '*.zip' -o -name '*.tar' -o -name '*.tgz' -o -name '*.gz' -o -name '*.bz2' -o -name '*.xz' \) -print0)
  [ "$found" -eq 0 ] && break
done
: > /app/parts.txt
tmp=$(mktemp)
while IFS= read -r -d '' f; do
  n=$(tr -d '\r' < "$f" | sed -e '$a\' | tail -n +2 | grep -c .)
  echo "$(basename "$f") $n" >> /app/parts.txt
  tr -d '\r' < "$f" | sed -e '$a\' | tail -n +2 >> "$tmp"
done < <(find "$work" -type f -regex '.*/part[0-9]+\.csv' -print0)
sort -o /app/parts.txt /app/parts.txt
{ echo "id,region,amount"; grep . "$tmp" | sort -t, -k1,1n; } > /app/combined.csv
rm -f "$tmp"
