#!/usr/bin/env python3
"""Writes hostile policy inputs into DIR, one file each: seeds for the policy fuzzer
(tests/fuzz/run_fuzz.sh) and the cases of tests/integration/policy_limits_test.sh.

    hostile_policies.py DIR

Each must be answered with a located error (or the effective policy) in bounded time and memory.
A file named conf_* holds a VASWAP_CONF string; the rest are YAML documents.
"""
import pathlib
import sys

MIB = 1 << 20


def billion_laughs():
    # Nine levels of nine aliases: 9**9 scalars once expanded, from 400 bytes.
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def cases():
    yield "billion_laughs.yaml", billion_laughs()
    yield "alias_only.yaml", "mode: &m auto\nguard: *m\n"
    yield "anchor_in_rules.yaml", ("mode: rules\nrules:\n  - &r {offload: capture:1, after: graph:1,"
                                   " before: graph:2}\n  - *r\n")
    yield "deep_flow.yaml", "a: " + "[" * (MIB // 2 - 8) + "\n"
    yield "deep_block.yaml", "".join(" " * i + f"k{i}:\n" for i in range(1200))
    yield "huge_scalar.yaml", "mode: " + "x" * (MIB - 16) + "\n"
    yield "huge_key.yaml", "k" * (MIB - 16) + ": 1\n"
    keys = "".join(f"key{i:07d}: {i}\n" for i in range(MIB // 16))
    yield "many_keys.yaml", keys[: MIB - 1]
    items = "selection:\n  include:\n" + "".join(f"    - lib{i}*\n" for i in range(MIB // 14))
    yield "long_list.yaml", items[: items.rfind("\n", 0, MIB - 1) + 1]
    yield "over_limit.yaml", "# " + "x" * MIB + "\n"
    # VASWAP_CONF: a long list, then the same key again and again (each once copied the list).
    conf = "Cselection.include=" + ";".join(f"p{i}" for i in range(40000))
    conf += ",guard=true" * ((MIB - len(conf)) // 11 - 1)
    yield "conf_long_list", conf
    yield "conf_unknown_keys", "C" + ",".join(f"key{i}=1" for i in range(MIB // 12))


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in cases():
        (out / name).write_text(text)


if __name__ == "__main__":
    main()
