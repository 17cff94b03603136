"""Where this package finds its library, its version and the trace format it reads.

Three ways to have the package, one answer each:
  - a wheel (pip install): vaswap/lib/libvaswap.so beside the package files;
  - cmake --install: <prefix>/share/vaswap/python/vaswap, the library in <prefix>/lib;
  - a checkout: python/vaswap, the library in build/plain/lib.
Both installs write _installed.py (cmake/_installed.py.in) with the library's directory relative
to the package and the version; a checkout has none and reads the public header, the version's
one home."""

import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent
CHECKOUT = PACKAGE.parents[1]  # only meaningful when not installed

try:
    from . import _installed
except ImportError:  # a checkout
    _installed = None


def installed():
    return _installed is not None


def library():
    """The libvaswap.so that goes with this package (it may not exist yet in a checkout)."""
    if _installed is not None:
        return (PACKAGE / _installed.LIBRARY_DIR / "libvaswap.so").resolve()
    return CHECKOUT / "build" / "plain" / "lib" / "libvaswap.so"


def version():
    if _installed is not None:
        return _installed.VERSION
    header = (CHECKOUT / "include" / "vaswap" / "vaswap.h").read_text()
    return ".".join(re.search(rf"^#define VASWAP_VERSION_{part} (\d+)$", header, re.M).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))


def trace_doc():
    """docs/TRACE.md, whose Events table `vaswap report` checks traces against."""
    return PACKAGE / "TRACE.md" if _installed is not None else CHECKOUT / "docs" / "TRACE.md"
