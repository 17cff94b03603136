"""vaswap's command line: `vaswap` (pip's entry point, <prefix>/bin/vaswap, scripts/vaswap).

    vaswap --version
    vaswap run [--policy FILE] [--trace PATH] [--library PATH] -- CMD [ARGS...]
    vaswap check-policy [--conf TEXT] [--library PATH] FILE
    vaswap check-policy --schema
    vaswap report [--perfetto FILE] [--plots DIR] [--no-progress] TRACE [TRACE...]

`run` puts libvaswap.so in front of LD_PRELOAD (keeping what was there), sets VASWAP_POLICY and
VASWAP_TRACE from its options, and replaces itself with CMD (exec): CMD keeps the launcher's
process id, so signals sent to it reach CMD, and its exit status is the launcher's.
"""

import argparse
import ctypes
import os
import pathlib
import subprocess
import sys

from . import _layout


def fail(message, code=2):
    print(f"vaswap: {message}", file=sys.stderr)
    sys.exit(code)


def find_library(explicit):
    """The libvaswap.so to preload: --library, VASWAP_LIBRARY, or the one that goes with this
    package (installed beside it, or this checkout's build/plain/lib)."""
    if explicit:
        path = pathlib.Path(explicit)
    elif os.environ.get("VASWAP_LIBRARY"):
        path = pathlib.Path(os.environ["VASWAP_LIBRARY"])
    else:
        path = _layout.library()
    if path.is_file():
        return path.resolve()
    hint = ("reinstall vaswap" if _layout.installed() and not explicit else
            "build it with `cmake -S . -B build/plain && cmake --build build/plain --target "
            "vaswap`")
    fail(f"cannot find libvaswap.so (looked at {path}); {hint}, or pass --library PATH")


def dependency(library, prefix):
    """The path of the library's dependency whose name starts with `prefix` (ldd), or None."""
    try:
        out = subprocess.run(["ldd", str(library)], capture_output=True, text=True, check=False)
    except OSError:
        return None
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts and parts[0].startswith(prefix) and len(parts) >= 3:
            return parts[2]
    return None


def sanitizer_runtime(library):
    """A sanitizer build of libvaswap.so needs its runtime (ASan's or TSan's) preloaded before it."""
    return dependency(library, "libasan.so") or dependency(library, "libtsan.so")


def preload_list(library, existing):
    runtime = sanitizer_runtime(library)
    entries = [e for e in existing.replace(" ", ":").split(":") if e]
    entries = [e for e in entries if pathlib.Path(e).name != "libvaswap.so" and e != runtime]
    front = ([runtime] if runtime else []) + [str(library)]
    return ":".join(front + entries)


def run(args):
    command = args.command
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        fail("run: no command given; usage: vaswap run [options] -- CMD [ARGS...]")
    env = dict(os.environ)
    library = find_library(args.library)
    env["LD_PRELOAD"] = preload_list(library, env.get("LD_PRELOAD", ""))
    if args.policy:
        policy = pathlib.Path(args.policy)
        if not policy.is_file():
            fail(f"run: the policy file {policy} does not exist")
        env["VASWAP_POLICY"] = str(policy.resolve())
    if args.trace:
        env["VASWAP_TRACE"] = str(pathlib.Path(args.trace).absolute())
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        fail(f"run: cannot run {command[0]}: {e.strerror}", 127)


def check_policy(args):
    """Prints the effective policy (or every error) as the preload would read it."""
    library = find_library(args.library)
    runtime = sanitizer_runtime(library)
    if runtime and runtime not in os.environ.get("LD_PRELOAD", ""):
        # A sanitizer build of libvaswap.so loads only into a process whose first library is the
        # ASan runtime: run this command again that way.
        env = dict(os.environ)
        # libstdc++ too: python links none, so ASan, starting first, would find no __cxa_throw
        # to forward to, and the first C++ exception (a YAML parse error) would abort.
        cxx = dependency(library, "libstdc++.so")
        env["LD_PRELOAD"] = ":".join(p for p in (runtime, cxx, env.get("LD_PRELOAD", "")) if p)
        env["ASAN_OPTIONS"] = ":".join(
            p for p in (env.get("ASAN_OPTIONS", ""), "detect_leaks=0") if p)  # python's own
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_layout.PACKAGE.parent), env.get("PYTHONPATH", "")) if p)
        os.execve(sys.executable, [sys.executable, "-m", "vaswap._cli"] + sys.argv[1:], env)
    lib = ctypes.CDLL(str(library))
    text = ctypes.create_string_buffer(1 << 20)
    if args.schema:
        if lib.vaswap_policy_schema(text, ctypes.c_size_t(len(text))) != 0:
            fail("check-policy: " + lib_error(lib))
        print(text.value.decode(), end="")
        return
    if not args.file:
        fail("check-policy: no policy file given; usage: vaswap check-policy [--conf TEXT] FILE")
    errors = ctypes.c_int(0)
    conf = args.conf.encode() if args.conf is not None else None
    status = lib.vaswap_policy_check(args.file.encode(), conf, text, ctypes.c_size_t(len(text)),
                                     ctypes.byref(errors))
    if status != 0:
        fail("check-policy: " + lib_error(lib))
    if errors.value:
        print(text.value.decode(), end="", file=sys.stderr)
        print(f"vaswap: {args.file}: {errors.value} error{'s' if errors.value != 1 else ''}",
              file=sys.stderr)
        sys.exit(1)
    print(f"# {args.file}: valid; the effective policy"
          + (" with --conf " + args.conf if args.conf else "") + ":")
    print(text.value.decode(), end="")


def lib_error(lib):
    lib.vaswap_last_error.restype = ctypes.c_char_p
    return lib.vaswap_last_error().decode()


class PrintVersion(argparse.Action):
    """--version: the package's version and the library `run` would preload (without loading it).
    Printed as is: argparse's own version action wraps long lines, and paths are long."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and the library")

    def __call__(self, parser, namespace, values, option_string=None):
        library = _layout.library()
        where = library if library.is_file() else f"not found at {library}"
        print(f"vaswap {_layout.version()} (libvaswap.so: {where})")
        parser.exit()


def main():
    parser = argparse.ArgumentParser(
        prog="vaswap",
        description="Graph-safe activation offload for unmodified CUDA programs.")
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    p_run = sub.add_parser(
        "run", help="run a program with libvaswap.so preloaded",
        description="Run CMD with libvaswap.so in front of LD_PRELOAD. Signals and the exit "
                    "status pass through: CMD replaces the launcher.")
    p_run.add_argument("--policy", metavar="FILE", help="policy file (sets VASWAP_POLICY)")
    p_run.add_argument("--trace", metavar="PATH",
                       help="write the trace here; %%p becomes the pid (sets VASWAP_TRACE)")
    p_run.add_argument("--library", metavar="PATH",
                       help="the libvaswap.so to preload (default: VASWAP_LIBRARY, then the "
                            "one installed with vaswap, or this checkout's build/plain/lib)")
    p_run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p_check = sub.add_parser(
        "check-policy", help="check a policy file and print the effective policy",
        description="Read FILE as the preload reads VASWAP_POLICY (with --conf as VASWAP_CONF) "
                    "and print the effective policy with where each value came from, or every "
                    "error. Exit status: 0 valid, 1 errors, 2 usage.")
    p_check.add_argument("file", nargs="?", metavar="FILE", help="the policy file (YAML)")
    p_check.add_argument("--conf", metavar="TEXT",
                         help="overrides in VASWAP_CONF syntax (key=value,key=value)")
    p_check.add_argument("--schema", action="store_true",
                         help="print the table of keys (docs/POLICY.md) instead")
    p_check.add_argument("--library", metavar="PATH", help="the libvaswap.so to use")
    p_report = sub.add_parser(
        "report", help="summarize traces: tables, a Perfetto timeline, plots",
        description="Read vaswap traces (one per process or rank; docs/TRACE.md) and print a "
                    "summary per run, per graph and per region. Bad or truncated lines are "
                    "reported with their line and skipped; the rest is still reported. Exit "
                    "status: 0, 1 when a trace had problems, 2 usage.")
    p_report.add_argument("traces", nargs="+", metavar="TRACE")
    p_report.add_argument("--perfetto", metavar="FILE",
                          help="also write a Chrome trace-event JSON (open it in ui.perfetto.dev)")
    p_report.add_argument("--plots", metavar="DIR",
                          help="also write memory.png, bandwidth.png and stalls.png here")
    p_report.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args()
    if args.verb == "report":
        from . import _report

        sys.exit(_report.main(args))
    if args.verb == "run":
        run(args)
    elif args.verb == "check-policy":
        check_policy(args)


if __name__ == "__main__":
    main()
