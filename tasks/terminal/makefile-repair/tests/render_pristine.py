#!/usr/bin/env python3
"""Tiny static-site renderer.

  render.py page SRC.md OUT.html      render one page
  render.py index OUT.html SRC.md...  write the index linking every page (sorted by file name)
"""
import html
import os
import sys


def title_and_body(path, text=None):
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    lines = text.splitlines()
    title = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("#") else os.path.basename(path)
    paras, cur = [], []
    for line in lines[1:]:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return title, paras


def page(src, out):
    with open(out, "w", encoding="utf-8") as f:
        f.write(page_html(src))


def page_html(src, text=None):
    """The page ``page`` writes for ``src`` (whose content is ``text`` if given)."""
    title, paras = title_and_body(src, text)
    body = "\n".join(f"<p>{html.escape(p)}</p>" for p in paras)
    doc = (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
           f"<link rel=\"stylesheet\" href=\"style.css\"></head>\n<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")
    return doc


def index(out, srcs):
    with open(out, "w", encoding="utf-8") as f:
        f.write(index_html(srcs))


def index_html(srcs, texts=None):
    """The index ``index`` writes for ``srcs`` (their contents ``texts[src]`` if given)."""
    items = []
    for src in sorted(srcs, key=os.path.basename):
        name = os.path.splitext(os.path.basename(src))[0]
        title, _ = title_and_body(src, None if texts is None else texts[src])
        items.append(f"<li><a href=\"{name}.html\">{html.escape(title)}</a></li>")
    doc = ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Index</title>"
           "<link rel=\"stylesheet\" href=\"style.css\"></head>\n<body>\n<ul>\n" + "\n".join(items) + "\n</ul>\n</body></html>\n")
    return doc


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "page":
        page(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "index":
        index(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
