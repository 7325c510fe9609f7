#!/bin/bash
# Builds /app/textstats deterministically: make_repo.sh DIR
set -euo pipefail
R=${1:-/app/textstats}
rm -rf "$R"; mkdir -p "$R"; cd "$R"
export GIT_AUTHOR_NAME="Lea Hoffmann" GIT_AUTHOR_EMAIL="lea@example.com"
export GIT_COMMITTER_NAME="Lea Hoffmann" GIT_COMMITTER_EMAIL="lea@example.com"
n=0
commit() {
  n=$((n+1))
  export GIT_AUTHOR_DATE="2024-04-0${n}T16:20:00+02:00" GIT_COMMITTER_DATE="2024-04-0${n}T16:20:00+02:00"
  git add -A && git commit -q -m "$1"
}
git init -q -b main .
git config user.name "Lea Hoffmann"; git config user.email "lea@example.com"
mkdir -p textstats tests
printf '__pycache__/\n.pytest_cache/\n' > .gitignore
: > textstats/__init__.py
cat > textstats/core.py <<'PY'
"""Text statistics."""
import re
from collections import Counter

WORD = re.compile(r"[A-Za-z']+")


def words(text):
    """Lower-cased words of a text."""
    return [w.lower() for w in WORD.findall(text)]


def count_words(text):
    """Number of words in a text."""
    return len(words(text))


def average_word_length(text):
    ws = words(text)
    return sum(map(len, ws)) / len(ws) if ws else 0.0
PY
cat > tests/test_core.py <<'PY'
from textstats.core import average_word_length, count_words


def test_count_simple():
    assert count_words("The cat sat.") == 3


def test_average():
    assert average_word_length("ab abcd") == 3.0
PY
cat > README.md <<'MD'
# textstats

Small text statistics library.

```python
from textstats.core import count_words
count_words("The cat sat.")  # 3
```
MD
cat > CHANGELOG.md <<'MD'
# Changelog

## 0.2.0 (unreleased)

## 0.1.0
- Word counts and average word length.
MD
commit "Initial version"
cat >> README.md <<'MD'

Words are runs of letters and apostrophes.
MD
commit "Document what a word is"
# ---- the commit to split ----
cat > textstats/core.py <<'PY'
"""Text statistics."""
import re
from collections import Counter

WORD = re.compile(r"[A-Za-z']+(?:-[A-Za-z']+)*")


def words(text):
    """Lower-cased words of a text; hyphenated compounds count as one word."""
    return [w.lower() for w in WORD.findall(text)]


def count_words(text):
    """Number of words in a text."""
    return len(words(text))


def average_word_length(text):
    ws = words(text)
    return sum(map(len, ws)) / len(ws) if ws else 0.0


def top_words(text, n=3):
    """The n most common words as (word, count), ties broken alphabetically."""
    counts = Counter(words(text))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
PY
cat > tests/test_core.py <<'PY'
from textstats.core import average_word_length, count_words


def test_count_simple():
    assert count_words("The cat sat.") == 3


def test_average():
    assert average_word_length("ab abcd") == 3.0


def test_hyphenated_words_count_once():
    assert count_words("A well-known state-of-the-art tool") == 4
PY
cat > textstats/cli.py <<'PY'
"""Command line interface: python3 -m textstats.cli FILE [N]"""
import sys

from textstats.core import count_words, top_words


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        text = f.read()
    n = int(argv[1]) if len(argv) > 1 else 3
    print(f"words: {count_words(text)}")
    for word, count in top_words(text, n):
        print(f"{word}\t{count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
cat > tests/test_cli.py <<'PY'
from textstats.cli import main


def test_cli(tmp_path, capsys):
    p = tmp_path / "t.txt"
    p.write_text("b a b c-d c-d c-d")
    assert main([str(p), "2"]) == 0
    assert capsys.readouterr().out == "words: 6\nc-d\t3\nb\t2\n"
PY
cat >> README.md <<'MD'

## Command line

    python3 -m textstats.cli notes.txt 5
MD
cat > CHANGELOG.md <<'MD'
# Changelog

## 0.2.0 (unreleased)
- Fix: hyphenated words such as "well-known" count as one word.
- Add the `textstats.cli` command line interface and `top_words()`.

## 0.1.0
- Word counts and average word length.
MD
commit "Add CLI and fix hyphenated word counting"
