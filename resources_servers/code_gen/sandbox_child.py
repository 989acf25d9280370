"""The process that runs one submitted program for one unit test. Standard library only; started by ``sandbox.py``.

Two stages, one file, so nothing of the server's package has to be importable (or readable) inside the sandbox:

* ``init`` runs first (as PID 1 of a fresh PID namespace when ``unshare`` is available). It forks the worker, and
  in that child, before anything untrusted runs, sets the resource limits, installs the seccomp filter (no new
  processes, no raised limits: what ``RLIMIT_NPROC`` cannot promise for root), drops file-system and network access
  with Landlock, and ``exec``s a fresh interpreter for the ``worker`` stage, so ``ctypes`` (needed for both) is never
  loaded where user code runs. It then reaps everything and exits with the worker's status (``128 + signal`` when a
  signal ended it). When PID 1 of a namespace exits, the kernel kills whatever is left in it.
* ``worker`` installs an audit hook that ends the process with ``EXIT_VIOLATION`` on any forbidden operation (a
  process spawn, a socket, a file outside the work directory, raising a limit), then runs the solution as
  ``__main__`` with the test input on stdin. The kernel layers of the init stage hold without the hook (tests run
  with it off); the hook is defence in depth, and turns a refused operation into a clear ``sandbox_violation``.

The configuration is one JSON argument. Exit codes below are the contract with ``sandbox.py``.
"""

import json
import os
import sys

EXIT_OK = 0
EXIT_RUNTIME_ERROR = 101
EXIT_SYNTAX_ERROR = 102
EXIT_MEMORY_ERROR = 103
EXIT_VIOLATION = 104
EXIT_SETUP_ERROR = 105


# Audit events that end the run. Sockets and ctypes are matched by prefix.
_FORBIDDEN_EVENTS = frozenset(
    {
        "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "subprocess.Popen",
        "os.link", "os.symlink", "resource.setrlimit", "resource.prlimit", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "sys.setprofile", "sys.settrace", "pty.spawn",
    }
)  # fmt: skip
_FORBIDDEN_PREFIXES = ("socket.", "ctypes.", "_ctypes.")
# Importing these would reach fork/exec or raw memory without any audit event on the way.
_FORBIDDEN_MODULES = frozenset({"_posixsubprocess", "ctypes", "_ctypes", "_xxsubinterpreters", "_testcapi"})
# Events whose first argument is a path the program reads (r) or changes (w).
_PATH_EVENTS = {
    "os.listdir": "r", "os.scandir": "r", "os.chdir": "r", "os.mkdir": "w", "os.rmdir": "w", "os.remove": "w",
    "os.chmod": "w", "os.chown": "w", "os.truncate": "w", "os.utime": "w", "shutil.rmtree": "w",
    "os.setxattr": "w", "os.removexattr": "w", "os.listxattr": "r", "os.getxattr": "r", "os.chflags": "w",
}  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_MAX_WRITABLE_OPENS = 64


# ----------------------------------------------------------------------------------------------------------------------
# init stage
# ----------------------------------------------------------------------------------------------------------------------


def _set_limits(limits: dict) -> None:
    import resource

    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    # RLIMIT_NPROC counts every process of the user, so the cap is "what exists now plus a few" (root is exempt).
    nproc = _processes_of_this_user() + limits["extra_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _processes_of_this_user() -> int:
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return count


def _load_module(name: str, path: str):
    """A standard-library-only module of ``nemo_gym/sandbox`` (``landlock.py``, ``seccomp.py``), loaded from its file:
    the package itself need not be importable here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_nemo_gym_{name}", path)
    if spec is None or spec.loader is None:
        raise OSError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _apply_layer(config: dict, name: str, apply) -> None:
    """Set up one kernel layer as its mode says: ``required`` fails the run without it, ``auto`` writes a note."""
    if config[name] == "off":
        return
    try:
        apply(_load_module(name, config[f"{name}_module"]))
    except OSError as e:
        if config[name] == "required":
            raise
        os.write(2, f"sandbox: {name} not applied ({e})\n".encode())


def _start_worker(config: dict) -> None:
    """In the forked child: limits, seccomp, Landlock, then a fresh interpreter for the worker stage. Never returns."""
    try:
        _set_limits(config["limits"])  # first: counting processes reads /proc, which Landlock then closes
        _apply_layer(config, "seccomp", lambda m: m.deny_new_processes())  # before Landlock hides its module file
        _apply_layer(config, "landlock", lambda m: m.restrict(config["read_paths"], [config["workdir"], os.devnull]))
        worker_config = json.dumps(config | {"stage": "worker"})
        os.execv(config["python"], [config["python"], "-I", "-S", "-B", os.path.abspath(__file__), worker_config])
    except BaseException as e:  # the exec failed, or a required layer could not be set up
        os.write(2, f"sandbox: setup failed: {type(e).__name__}: {e}\n".encode())
    os._exit(EXIT_SETUP_ERROR)


def run_init(config: dict) -> None:
    worker = os.fork()
    if worker == 0:
        _start_worker(config)
    status = 0
    while True:  # also reaps orphans re-parented to us as PID 1
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        if pid == worker:
            status = wait_status
            break
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


# ----------------------------------------------------------------------------------------------------------------------
# worker stage
# ----------------------------------------------------------------------------------------------------------------------


def _install_audit_hook(read_roots: tuple[str, ...], workdir: str) -> None:
    """End the process on any operation outside the sandbox's rules. Only immutable state is captured."""
    realpath, write, exit_now, getpid = os.path.realpath, os.write, os._exit, os.getpid
    work_prefix = workdir.rstrip("/") + "/"
    read_prefixes = tuple(root.rstrip("/") + "/" for root in read_roots)
    read_files = frozenset(read_roots)
    writable_opens = [0]

    def deny(event: str, detail: object) -> None:
        write(2, f"\nsandbox: blocked {event} {detail!r:.200}\n".encode(errors="replace"))
        exit_now(EXIT_VIOLATION)

    def allowed(path: object, mode: str) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor: it was checked when it was opened
        if not isinstance(path, str | bytes | os.PathLike):
            return False
        try:
            resolved = realpath(os.fsdecode(path))
        except (TypeError, ValueError, OSError):
            return False
        if resolved == workdir or resolved.startswith(work_prefix) or resolved == os.devnull:
            return True
        return mode == "r" and (resolved in read_files or resolved.startswith(read_prefixes))

    def hook(event: str, args: tuple) -> None:
        if event in _FORBIDDEN_EVENTS or event.startswith(_FORBIDDEN_PREFIXES):
            deny(event, args)
        elif event == "import":
            if args[0] in _FORBIDDEN_MODULES or args[0].split(".")[0] in _FORBIDDEN_MODULES:
                deny(event, args[0])
        elif event == "open":
            path, mode, flags = args
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
            if path is None:
                return
            if not allowed(path, "w" if writing else "r"):
                deny(event, path)
            if writing and not isinstance(path, int):
                writable_opens[0] += 1
                if writable_opens[0] > _MAX_WRITABLE_OPENS:
                    deny("open (too many files written)", path)
        elif event in _PATH_EVENTS:
            if args and not allowed(args[0], _PATH_EVENTS[event]):
                deny(event, args[0])
        elif event == "os.rename":
            if not (allowed(args[0], "w") and allowed(args[1], "w")):
                deny(event, args[:2])
        elif event in ("os.kill", "os.killpg"):
            if args[0] not in (0, getpid()):
                deny(event, args)

    sys.addaudithook(hook)


def _finish(code: int) -> None:
    """Wait for the program's own threads (a common way to get a bigger stack), flush, and exit without atexit."""
    threading = sys.modules.get("threading")
    if threading is not None:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or EXIT_RUNTIME_ERROR
    os._exit(code)


def _call_function(namespace: dict, fn_name: str) -> None:
    """Call-based tests: stdin holds a JSON list of positional arguments; the return value is printed as JSON."""
    arguments = json.loads(sys.stdin.read() or "[]")
    target = namespace.get(fn_name)
    if target is None and isinstance(namespace.get("Solution"), type):
        target = getattr(namespace["Solution"](), fn_name, None)
    if not callable(target):
        raise NameError(f"no function named {fn_name!r} in the solution")
    result = target(*arguments) if isinstance(arguments, list) else target(arguments)
    sys.stdout.write(json.dumps(result) + "\n")


def run_worker(config: dict) -> None:
    """Load the solution under the audit hook and run it: as ``__main__`` for stdin/stdout tests, or as a module whose
    ``fn_name`` is then called for call-based tests."""
    import traceback
    import types

    workdir, fn_name = config["workdir"], config.get("fn_name")
    with open(os.path.join(workdir, "solution.py"), encoding="utf-8") as source_file:
        source = source_file.read()
    if config["audit_hook"]:
        _install_audit_hook(tuple(config["read_paths"]), workdir)
    try:
        code = compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as e:
        sys.stderr.write("".join(traceback.format_exception_only(type(e), e)))
        _finish(EXIT_SYNTAX_ERROR)
    module = types.ModuleType("solution" if fn_name else "__main__")
    module.__file__ = os.path.join(workdir, "solution.py")
    sys.modules[module.__name__] = module
    del source, config
    try:
        exec(code, module.__dict__)
        if fn_name:
            _call_function(module.__dict__, fn_name)
    except SystemExit as e:
        if e.code not in (None, 0):
            if not isinstance(e.code, int):
                sys.stderr.write(f"{e.code}\n")
            _finish(EXIT_RUNTIME_ERROR)
    except MemoryError:
        sys.stderr.write("MemoryError\n")
        _finish(EXIT_MEMORY_ERROR)
    except BaseException as e:
        # The first frame is this function; the program's own frames follow.
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        _finish(EXIT_RUNTIME_ERROR)
    _finish(EXIT_OK)


if __name__ == "__main__":
    _config = json.loads(sys.argv[1])
    if _config["stage"] == "init":
        run_init(_config)
    else:
        run_worker(_config)
