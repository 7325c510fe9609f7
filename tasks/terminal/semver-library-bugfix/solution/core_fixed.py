import re
from dataclasses import dataclass
from functools import cmp_to_key

_NUM = r"(?:0|[1-9]\d*)"
_PRE_ID = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD_ID = r"[0-9A-Za-z-]+"
_VERSION = re.compile(
    rf"^({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-({_PRE_ID}(?:\.{_PRE_ID})*))?"
    rf"(?:\+({_BUILD_ID}(?:\.{_BUILD_ID})*))?$"
)


@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple = ()
    build: tuple = ()

    def __str__(self):
        s = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            s += "-" + ".".join(self.prerelease)
        if self.build:
            s += "+" + ".".join(self.build)
        return s


def parse(text):
    text = text.strip()
    if text[:1] in ("v", "="):
        text = text[1:]
    m = _VERSION.match(text)
    if not m:
        raise ValueError(f"invalid version: {text!r}")
    major, minor, patch, pre, build = m.groups()
    return Version(
        int(major),
        int(minor),
        int(patch),
        tuple(pre.split(".")) if pre else (),
        tuple(build.split(".")) if build else (),
    )


def _cmp(a, b):
    return (a > b) - (a < b)


def _compare_id(x, y):
    xn, yn = x.isdigit(), y.isdigit()
    if xn and yn:
        return _cmp(int(x), int(y))
    if xn != yn:
        return -1 if xn else 1
    return _cmp(x, y)


def _compare_pre(a, b):
    for x, y in zip(a, b):
        c = _compare_id(x, y)
        if c:
            return c
    return _cmp(len(a), len(b))


def compare(a, b):
    """-1, 0 or 1 as version a has lower, equal or higher precedence than b."""
    if isinstance(a, str):
        a = parse(a)
    if isinstance(b, str):
        b = parse(b)
    c = _cmp((a.major, a.minor, a.patch), (b.major, b.minor, b.patch))
    if c:
        return c
    if a.prerelease and not b.prerelease:
        return -1
    if b.prerelease and not a.prerelease:
        return 1
    return _compare_pre(a.prerelease, b.prerelease)


def _expand(token):
    if token.startswith("^"):
        v = parse(token[1:])
        if v.major > 0:
            upper = f"{v.major + 1}.0.0"
        elif v.minor > 0:
            upper = f"0.{v.minor + 1}.0"
        else:
            upper = f"0.0.{v.patch + 1}"
        return [(">=", v), ("<", parse(upper))]
    if token.startswith("~"):
        v = parse(token[1:])
        return [(">=", v), ("<", parse(f"{v.major}.{v.minor + 1}.0"))]
    m = re.match(r"^(<=|>=|<|>|=)?\s*(.+)$", token)
    if not m:
        raise ValueError(f"invalid comparator: {token!r}")
    return [(m.group(1) or "=", parse(m.group(2)))]


_OPS = {
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "=": lambda c: c == 0,
}


def _tokens(alternative):
    out = []
    for tok in alternative.split():
        if out and out[-1] in ("<", "<=", ">", ">=", "="):
            out[-1] += tok
        else:
            out.append(tok)
    return out


def satisfies(version, range_text):
    v = parse(version) if isinstance(version, str) else version
    for alternative in range_text.split("||"):
        comparators = []
        for token in _tokens(alternative):
            comparators.extend(_expand(token))
        if comparators and all(_OPS[op](compare(v, bound)) for op, bound in comparators):
            return True
    return False


def max_satisfying(versions, range_text):
    """The highest-precedence version string in `versions` that satisfies the range, or None.

    Among versions of equal precedence the first one in `versions` wins."""
    ok = [v for v in versions if satisfies(v, range_text)]
    return max(ok, key=cmp_to_key(compare)) if ok else None
