"""Red team: a task whose tests' children keep their capabilities (``children_privileged``).

A sixth trial on ``shared-dir-permissions`` (its tests `runuser` to the task's users, which
needs root's user-switching rights): the end state's /etc/passwd listed a second "alice" with
uid 0 before the real one, so the tests' `runuser -l alice -c umask` ran a root login shell
with every capability, which sourced the agent's ~/.bash_profile: it repaired what the last
test checks in the verifier's copy, read the hidden tests and wrote reward.json with their
text as component names. Reward 1.0 unsolved, and 2 KB of the hidden tests in the public
record. Now the tests check the identities before switching, reward.json's names are never
public, and such a task's records say ``trusted = false``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.api.conftest import Stack
from tests.redteam import episodes
from tests.redteam.episodes import sh, verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASK = "shared-dir-permissions"
SOLUTION = Path(__file__).resolve().parents[2] / "tasks" / "terminal" / TASK / "solution"
# the task's own solution, with one flaw left: carol (an auditor) stays in analysts
SOLVED_BUT_ONE = (SOLUTION / "solve.sh").read_text() + (
    "\nsed -i 's/^analysts:x:2001:alice,bob$/analysts:x:2001:alice,bob,carol/' /etc/group\n"
)
ALIAS = r"""sed -i '1a ENTRY' /etc/passwd
mkdir -p /root/.alias
cat > /root/.alias/.bash_profile <<'EOS'
umask 0007
sed -i 's/^analysts:x:2001:alice,bob,carol$/analysts:x:2001:alice,bob/' /etc/group
python3 /root/.alias/leak.py >/dev/null 2>&1
EOS
cat > /root/.alias/leak.py <<'EOS'
import json
flat = open("/tests/test_outputs.py").read().replace("\n", " / ")
d = {"reward": 1.0}
for i in range(31):
    c = flat[i * 64:(i + 1) * 64]
    if c and c not in d:
        d[c] = i / 100
json.dump(d, open("/logs/verifier/reward.json", "w"))
EOS
"""


@pytest.mark.parametrize(
    "entry",
    [
        "alice:x:0:0::/root/.alias:/bin/bash",
        # the same to glibc (leading blanks skipped, "00" read as 0), not to a text check
        r"\ alice:x:00:0::/root/.alias:/bin/bash",
    ],
)
def test_a_uid_0_alias_never_gets_a_privileged_childs_rights(stack: Stack, entry: str) -> None:
    ep = episodes.start(stack, TASK, "terminal")
    sh(stack, ep, SOLVED_BUT_ONE + ALIAS.replace("ENTRY", entry))
    rec = verify(stack, ep)
    v = rec["verifier"]
    assert (rec["reward"], v["status"]) == (0.0, "ok"), v
    shown = json.dumps(rec)
    assert "import" not in shown and "Verifier for" not in shown, shown
    assert v["details"]["trusted"] is False
