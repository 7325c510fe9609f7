#!/bin/bash
set -euo pipefail
cd /app
find /app/corpus -type f -name '*.txt' -print0 \
  | xargs -0 cat \
  | tr -c 'A-Za-z' '\n' \
  | tr 'A-Z' 'a-z' \
  | grep -v '^$' \
  | grep -vxFf /app/stopwords.txt \
  | sort | uniq -c \
  | awk '{print $2 "\t" $1}' \
  | sort -t $'\t' -k2,2nr -k1,1 \
  | awk 'NR<=20' > /app/top_words.tsv
