#!/bin/bash
set -euo pipefail
cat > /app/bin/store_report.sh <<'SH'
#!/bin/bash
# store_report.sh INPUT_DIR OUTPUT_FILE -- see /app/REPORT_SPEC.md
set -euo pipefail
export LC_ALL=C

if [ $# -ne 2 ]; then
  echo "usage: store_report.sh INPUT_DIR OUTPUT_FILE" >&2
  exit 2
fi
dir=$1
out=$2
if [ ! -d "$dir" ]; then
  echo "store_report.sh: not a directory: $dir" >&2
  exit 2
fi

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

# one pass over all files: strip CR, skip each file's header, tolerate a missing final newline
find "$dir" -type f -name '*.csv' -print0 \
  | xargs -0 -r awk 'FNR == 1 { next } { sub(/\r$/, "") } NF { print }' > "$tmp"

{
  printf 'store\trevenue\tskus\ttop_sku\n'
  awk -F, '
    {
      split($4, p, ".")
      cents[$2] += $3 * (p[1] * 100 + p[2])
      q[$2 SUBSEP $5] += $3
      if (!(($2, $5) in seen)) { seen[$2, $5] = 1; n[$2]++ }
    }
    END {
      for (k in q) {
        split(k, a, SUBSEP); s = a[1]; sku = a[2]
        if (!(s in best) || q[k] > bq[s] || (q[k] == bq[s] && sku < best[s])) { best[s] = sku; bq[s] = q[k] }
      }
      for (s in cents) printf "%s\t%d.%02d\t%d\t%s\n", s, int(cents[s] / 100), cents[s] % 100, n[s], best[s]
    }' "$tmp" | sort -t "$(printf '\t')" -k2,2gr -k1,1
} > "$out"
SH
chmod 755 /app/bin/store_report.sh
