#!/bin/bash
# store_report.sh INPUT_DIR OUTPUT_FILE
#
# Summarise the sales CSV files (*.csv, header: date,store,qty,price,sku) found in
# INPUT_DIR into a per-store report. See /app/REPORT_SPEC.md.
set -e

DIR=$1
OUT=$2

tmp=/tmp/report.$$
for f in $(ls $DIR/*.csv); do
  cat $f >> $tmp
done

# drop the header
tail -n +2 $tmp > $tmp.body

echo "store	revenue	skus	top_sku" > $OUT
for store in $(cut -d, -f2 $tmp.body | sort -u); do
  grep ",$store," $tmp.body > $tmp.store
  revenue=$(awk -F, '{ s += $3 * $4 } END { print s }' $tmp.store)
  skus=$(cut -d, -f5 $tmp.store | sort -u | wc -l)
  top=$(awk -F, '{ q[$5] += $3 } END { for (k in q) print q[k], k }' $tmp.store | sort -n | tail -1 | cut -d' ' -f2)
  echo "$store	$revenue	$skus	$top" >> $OUT.unsorted
done
sort -k2 -n $OUT.unsorted >> $OUT
rm -f $tmp $tmp.body $tmp.store
