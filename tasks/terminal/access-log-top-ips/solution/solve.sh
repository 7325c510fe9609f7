#!/bin/bash
set -euo pipefail
mkdir -p /app/report
cd /app/logs
# zcat -f handles both plain and gzip files
zcat -f access.log access.log.1 access.log.*.gz \
  | awk -F'"' '$6 !~ /^kube-probe\// { split($1, a, " "); split($3, b, " "); print a[1], b[1] }' > /tmp/ip_status.txt
{
  echo "ip,requests"
  awk '{print $1}' /tmp/ip_status.txt | sort | uniq -c | awk '{print $2 "," $1}' \
    | LC_ALL=C sort -t, -k2,2nr -k1,1 | awk 'NR<=10'
} > /app/report/top_ips.csv
awk '{c[substr($2,1,1) "xx"]++} END {printf "{\"2xx\": %d, \"3xx\": %d, \"4xx\": %d, \"5xx\": %d}\n", c["2xx"], c["3xx"], c["4xx"], c["5xx"]}' \
  /tmp/ip_status.txt > /app/report/status_classes.json
