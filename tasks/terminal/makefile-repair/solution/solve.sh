#!/bin/bash
set -euo pipefail
cd /app/site
cat > Makefile <<'MK'
PAGES := $(sort $(wildcard src/pages/*.md))
HTML  := $(patsubst src/pages/%.md,out/site/%.html,$(PAGES))
SITE  := out/site/index.html out/site/style.css $(HTML)

.PHONY: all dist clean

# default goal
all: dist

dist: out/site.tar.gz

out/site.tar.gz: $(SITE)
	tar --sort=name --owner=0 --group=0 --numeric-owner -czf $@ -C out site

out/site/%.html: src/pages/%.md tools/render.py | out/site
	python3 tools/render.py page $< $@

out/site/index.html: $(PAGES) tools/render.py | out/site
	python3 tools/render.py index $@ $(PAGES)

out/site/style.css: static/style.css | out/site
	cp $< $@

out/site:
	mkdir -p $@

clean:
	rm -rf out
MK
make clean >/dev/null
make >/dev/null
