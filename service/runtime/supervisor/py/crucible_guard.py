"""Import precedence in the verifier's sandbox: the pristine toolchain wins every name.

Loaded at interpreter start-up by ``crucible-verifier.pth``, which Crucible puts into every
site directory of the task image's toolchain in the verifier's sandbox only (never in an
episode's). It runs in every Python process there and must not depend on anything but the
standard library (Python 3.8 or newer).

The rule, by construction rather than by a list of names: a top-level module is resolved
over ``sys.path`` entry by entry, and the first location that holds a *pristine* module of
that name wins over any earlier location holding an *agent-written* one. A location is
agent-written when its change time is at or after ``CRUCIBLE_PRISTINE_BEFORE`` (ns since the
epoch) and before ``CRUCIBLE_AGENT_WRITTEN_UNTIL`` (the test command's start): everything
of the episode's end state arrived in the verifier's sandbox by one archive extraction in
that window, and no process can set a file's change time, while the image's own files are
older and what the test run writes itself (tools ``test.sh`` installs) is newer.
``/tests`` (the task's tests, placed by Crucible) and Crucible's own read-only mount count
as pristine. So ``pytest.py``, ``_pytest/``,
``json.py``, ``sitecustomize.py``, sourceless ``.pyc`` and extension modules in the
workdir, in any letter case or suffix Python's own finder accepts, never displace the
toolchain; a module only the agent provides (``solution``, the package under test) still
imports. Names that are not top-level (``pkg.sub``) follow their package's ``__path__``.

Start-up is stricter. In the task's own pytest process, nothing agent-written may be
imported until Crucible's observer plugin has taken its session key and pytest turns to the
tests (``allow_agent_modules``, called from the plugin): before that, a name only the agent
provides is refused as if absent. (A red-team trial planted ``/app/nt.py``: the standard
library's ``ntpath`` tries ``import nt`` while pytest starts, and the agent's module ran
before the plugin, took the key and wrote a passing session.) The plugin relaxes this for
the processes the tests start (``CRUCIBLE_GUARD_RELAXED``), so a project's own test run
or program imports its modules as usual.

After start-up, agent-written code may still run in the judging process when the tests
import it (``import semverlite``), and code that shares a process with the reporter has
its rights: a red-team trial found the observer with ``gc`` and passed only the real
tests. So the judging process is watched, not trusted to stay clean: an audit hook
(PEP 578; it cannot be removed once added) sees every code object about to execute
(``exec``: imports, ``runpy``, ``exec(compile(...))``), every source compiled under a file
name (``compile``), every extension module and shared library loaded (``import`` with a
file, ``ctypes.dlopen``), and names each agent-written file among them (the module's file,
its cached bytecode, the code's own file name) *before* that code runs (``watch_agent_code``).
Agent-written includes what changed while the judge ran and it did not write itself (the
programs the tests run are the agent's), and text the tests compile or evaluate themselves
counts as the agent's too (``_tests_compile``).
The observer signs and sends each one, so the verifier knows the outcome came from a
process where the agent's code ran and does not count it (``service.verifiers.terminal``).
What the hook cannot attribute is text a library (not the tests' own code) evaluates on
the tests' behalf, or data the tests unpickle: the task's tests then execute the agent's
input on purpose.
"""

from __future__ import annotations

import os
import sys
from _thread import get_ident
from importlib.machinery import PathFinder

_TRUSTED_PREFIXES = ("/tests/", "/opt/crucible/")
_PYTEST_NAMES = ("pytest", "py.test", "pytest-3")
_state = {"strict": False}
_watch = {"sink": None, "seen": set(), "pending": [], "busy": set()}  # busy: thread ids
# In a process that judges: when it started (ns) and the files it wrote itself since.
_run = {"since": 0, "own": set()}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _is_pytest_process() -> bool:
    """True for ``pytest ...``, ``python -m pytest ...`` (``sys.orig_argv``: 3.10+) and the
    like, judged from the command line before anything else runs."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv or [])
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1].split(".")[0] in ("pytest", "py")
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:].split(".")[0] in ("pytest", "py")
        if not arg.startswith("-") and os.path.basename(arg).startswith(_PYTEST_NAMES):
            return True
    return False


def allow_agent_modules() -> None:
    """End the start-up rule: agent-written modules import again (pristine still wins)."""
    _state["strict"] = False


def _threshold() -> tuple[int, int]:
    """The window of change times (ns) that mark agent-written files: from
    ``CRUCIBLE_PRISTINE_BEFORE`` (the moment before the replay) up to
    ``CRUCIBLE_AGENT_WRITTEN_UNTIL`` (the moment the test command started; 0: open).
    Files changed later were written by the test run itself, e.g. tools ``test.sh``
    installs at verify time. ``(0, 0)`` outside a verification."""
    try:
        start = int(os.environ.get("CRUCIBLE_PRISTINE_BEFORE", ""))
    except ValueError:
        return 0, 0
    try:
        end = int(os.environ.get("CRUCIBLE_AGENT_WRITTEN_UNTIL", "0"))
    except ValueError:
        end = 0
    return start, end


def _location(spec) -> str | None:  # noqa: ANN001 (ModuleSpec; kept 3.8-compatible)
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        return spec.origin
    locations = list(spec.submodule_search_locations or ())
    return locations[0] if locations else None


def is_agent_written(path: str, window: tuple[int, int]) -> bool:
    """True when ``path`` (a module file or package directory) may hold the agent's
    bytes: its change time lies in ``window`` (``_threshold``: it arrived with the end
    state), or, in a process that judges, at or after the moment it started unless the
    process wrote it itself (``_run``): then a program the tests ran wrote it while the
    tests ran (a trial's ``make clean`` planted ``/app/html.py`` for a later lazy
    ``import html`` in the judge)."""
    start, end = window
    if start <= 0 or path.startswith(_TRUSTED_PREFIXES):
        return False
    try:
        ctime = os.stat(path).st_ctime_ns
    except OSError:
        return False
    if ctime >= start and (end <= 0 or ctime < end):
        return True
    since = _run["since"]
    return since > 0 and ctime >= since and os.path.abspath(path) not in _run["own"]


class PristineFirstFinder:
    """A ``sys.meta_path`` finder placed first: pristine modules win over agent-written ones.

    Returns ``None`` (defer to the normal finders) for submodules, for names no ``sys.path``
    entry holds and when the first candidate is already pristine.
    """

    def __init__(self, threshold: tuple[int, int]) -> None:
        self.threshold = threshold

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if path is not None or "." in name:
            return None
        first_agent = None
        for entry in list(sys.path):
            try:
                spec = PathFinder.find_spec(name, [entry])
            except (ImportError, OSError, ValueError):
                continue
            if spec is None:
                continue
            location = _location(spec)
            if location is None or not is_agent_written(location, self.threshold):
                return spec if first_agent is not None else None
            if first_agent is None:
                first_agent = spec
        if first_agent is not None and _state["strict"]:
            raise ModuleNotFoundError(
                f"No module named {name!r} (agent-written; refused while the verifier starts)",
                name=name,
            )
        return None

    def invalidate_caches(self) -> None:
        """Nothing cached here (``PathFinder`` keeps its own caches)."""


def watch_agent_code(sink) -> None:  # noqa: ANN001 (Callable[[str, str], None])
    """Hand every agent-written file whose code is about to run in this process to
    ``sink(path, how)``, once per file, before it runs; what was seen since start-up
    first. ``how``: ``exec``, ``bytecode``, ``compile``, ``extension`` or ``dlopen``."""
    _watch["sink"] = sink
    pending, _watch["pending"] = _watch["pending"], []
    for path, how in pending:
        sink(path, how)


def _seen(path, how: str, window: tuple[int, int]) -> None:  # noqa: ANN001
    if not isinstance(path, str) or not path.startswith("/") or path in _watch["seen"]:
        return
    if is_agent_written(path, window):
        _report(path, how)


def _report(path: str, how: str) -> None:
    if path in _watch["seen"]:
        return
    _watch["seen"].add(path)
    sink = _watch["sink"]
    if sink is None:
        _watch["pending"].append((path, how))
    else:
        sink(path, how)


def _module_files(frame) -> tuple:  # noqa: ANN001
    """The ``__file__`` and ``__cached__`` of the module importlib is executing, when the
    caller of ``exec`` is importlib's ``_call_with_frames_removed``: the files the finder
    chose (a code object's own file name can say anything in a sourceless ``.pyc``)."""
    if frame is None or frame.f_code.co_name != "_call_with_frames_removed":
        return ()
    args = frame.f_locals.get("args") or ()
    namespace = args[1] if len(args) > 1 and isinstance(args[1], dict) else {}
    return namespace.get("__file__"), namespace.get("__cached__")


def _own_write(event: str, args: tuple) -> None:
    """Remember a file this process opens for writing or renames into place."""
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if not writes or isinstance(path, int) or path is None:
            return
    else:  # os.rename / os.replace: (src, dst, src_dir_fd, dst_dir_fd)
        path = args[1] if len(args) > 1 else None
        if path is None or isinstance(path, int):
            return
    _run["own"].add(os.path.abspath(os.fsdecode(path)))


def _tests_compile(frame) -> str | None:  # noqa: ANN001
    """``file:line`` of the task's tests when they compile or evaluate text themselves
    (``exec(src)``, ``eval``, ``compile``): the text is the tests' input, which the
    verifier cannot tell from the agent's (a trial committed a forging ``pricing.py`` that
    the tests ``exec``-ed). Loading the tests' own helper files through importlib is not
    this (importlib's frame calls ``compile``)."""
    if frame is None:
        return None
    where = frame.f_code.co_filename
    return f"{where}:{frame.f_lineno}" if where.startswith("/tests/") else None


def _audit_hook(window: tuple[int, int]):  # noqa: ANN202
    watched = ("exec", "compile", "import", "ctypes.dlopen", "open", "os.rename")

    def caller():  # noqa: ANN202
        try:
            return sys._getframe(2)  # the frame that called exec/compile (hook is 0, 1)
        except ValueError:
            return None

    def hook(event: str, args: tuple) -> None:
        if event not in watched:
            return
        me = get_ident()
        if me in _watch["busy"]:  # an event of the hook's own work, in this thread
            return
        _watch["busy"].add(me)
        try:
            if event in ("open", "os.rename"):
                _own_write(event, args)
            elif event == "exec":
                code = args[0] if args else None
                for i, path in enumerate(_module_files(caller())):
                    _seen(path, "bytecode" if i else "exec", window)
                _seen(getattr(code, "co_filename", None), "exec", window)
            elif event == "compile":
                source, filename = (tuple(args) + (None, None))[:2]
                _seen(filename, "compile", window)
                if isinstance(source, (str, bytes)):
                    where = _tests_compile(caller())
                    if where is not None:
                        _report(where, "tests_compile")
            elif event == "import":
                _seen(args[1] if len(args) > 1 else None, "extension", window)
            else:
                _seen(args[0] if args else None, "dlopen", window)
        except Exception as e:  # noqa: BLE001 (never break the interpreter)
            # Fail closed: an event the watch could not check may have been agent code, so
            # the judge hears of it (and scores the run as one where agent code ran).
            _report(f"<the watch failed on {event}: {type(e).__name__}: {e}>"[:300], "watch_error")
        finally:
            _watch["busy"].discard(me)

    return hook


def install() -> None:
    """Put the finder first on ``sys.meta_path`` once per process (no-op without a
    threshold, i.e. outside a Crucible verification), strict in a pytest process that is
    not a descendant of the task's own run."""
    threshold = _threshold()
    if threshold[0] <= 0:
        return
    if any(isinstance(f, PristineFirstFinder) for f in sys.meta_path):
        return
    relaxed = os.environ.get("CRUCIBLE_GUARD_RELAXED") == "1"
    _state["strict"] = not relaxed and _is_pytest_process()
    sys.meta_path.insert(0, PristineFirstFinder(threshold))
    if not relaxed and (_state["strict"] or _holds_observation_pipe()):
        # a process that may become the judge is watched from its first instruction (a
        # hook added later would miss code that ran before it)
        import time

        _run["since"] = time.time_ns()
        sys.addaudithook(_audit_hook(threshold))


def _holds_observation_pipe() -> bool:
    """True when fd 3 is a FIFO: the supervisor's observation pipe, inherited until the
    observer takes it (any process of the test command may load the plugin)."""
    import stat

    try:
        return stat.S_ISFIFO(os.fstat(3).st_mode)
    except OSError:
        return False


install()
