"""semverlite: parse, compare and match Semantic Versioning 2.0.0 versions.

Rules implemented (https://semver.org, section 11 for precedence):

* A version is ``MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]``. MAJOR, MINOR and PATCH are
  non-negative integers **without leading zeros**. PRERELEASE and BUILD are non-empty
  dot-separated identifiers of ``[0-9A-Za-z-]``; numeric PRERELEASE identifiers must not
  have leading zeros. Anything else raises ``ValueError``. Surrounding whitespace is ignored,
  and a single leading ``v`` or ``=`` is allowed (``v1.2.3``).
* Precedence: compare MAJOR, MINOR, PATCH numerically. A version with a pre-release has
  lower precedence than the same version without one. Pre-releases are compared identifier
  by identifier from left to right: numeric identifiers numerically, alphanumeric ones in
  ASCII order, numeric identifiers always lower than alphanumeric ones; if all shared
  identifiers are equal, the longer list wins. BUILD metadata is ignored entirely, so
  ``compare("1.0.0+a", "1.0.0+b") == 0``.
* Ranges: comparator sets separated by ``||`` (OR); within a set, comparators separated by
  whitespace (AND; any amount of whitespace, leading/trailing whitespace ignored). A comparator
  is ``OP VERSION`` with OP one of ``< <= > >= =`` or empty (meaning ``=``), optionally with
  whitespace between OP and VERSION (``>= 1.2.3``), or a shorthand:
    - ``^X.Y.Z``: ``>=X.Y.Z`` and below the next version that changes the left-most non-zero
      of X, Y, Z: ``^1.2.3`` = ``>=1.2.3 <2.0.0``, ``^0.2.3`` = ``>=0.2.3 <0.3.0``,
      ``^0.0.3`` = ``>=0.0.3 <0.0.4``;
    - ``~X.Y.Z``: ``>=X.Y.Z <X.(Y+1).0``.
  Bounds are compared with plain precedence (so ``2.0.0-rc.1`` satisfies ``<2.0.0``).
"""
from .core import Version, compare, parse, satisfies, max_satisfying

__all__ = ["Version", "compare", "parse", "satisfies", "max_satisfying"]
