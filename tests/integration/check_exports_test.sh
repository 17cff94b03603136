#!/usr/bin/env bash
# DESIGN.md invariant 9: libvaswap.so exports exactly the CUDA entry points it interposes (the
# list in interpose/hooks.def), dlsym (which it routes), and vaswap_*; and nothing it depends on
# can leak symbols into the host: yaml-cpp and libunwind are reached only through
# libvaswap_yaml.so / libvaswap_unwind.so, loaded RTLD_LOCAL.
set -euo pipefail
lib=$1/lib/libvaswap.so
src=$2
hooked=$(sed -nE 's/^VASWAP_RUNTIME_HOOK\([A-Za-z0-9]+, ([A-Za-z0-9_]+),.*/\1/p; s/^VASWAP_DRIVER_HOOK\([A-Za-z0-9]+, [A-Za-z0-9_]+, ([A-Za-z0-9_]+),.*/\1/p' \
  "$src/interpose/hooks.def" | sort)
# Every entry of the table is read (a kind or name this pattern missed was once left out).
entries=$(grep -cE '^VASWAP_(RUNTIME|DRIVER)_HOOK\(' "$src/interpose/hooks.def")
[[ $(echo "$hooked" | wc -l) -eq $entries ]] || { echo "read $(echo "$hooked" | wc -l) of the hook table's $entries entries"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort)

bad=$(comm -23 <(echo "$exported") <(printf '%s\n' $hooked dlsym | sort) | grep -Ev '^vaswap_[a-z0-9_]+$' || true)
if [[ -n "$bad" ]]; then echo "libvaswap.so exports symbols outside the allowed set:"; echo "$bad"; exit 1; fi
missing=$(comm -13 <(echo "$exported") <(printf '%s\n' $hooked dlsym | sort))
if [[ -n "$missing" ]]; then echo "hooks.def lists symbols libvaswap.so does not export:"; echo "$missing"; exit 1; fi
# Exported unversioned, so that they take over libcudart's versioned symbols.
if nm -D --defined-only "$lib" | grep -E ' (cuda|cu)[A-Za-z0-9_]*@' ; then echo "a hook is versioned"; exit 1; fi

needed=$(readelf -d "$lib" | awk '/NEEDED/ {print $5}' | tr -d '[]')
echo "exports: $(echo "$exported" | wc -l) symbols ($(echo "$hooked" | wc -l) hooks, dlsym, vaswap_*); NEEDED: ${needed:-none}"
for dep in $needed; do
  case "$dep" in
    libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libdl.so.*|libpthread.so.*|ld-linux*|libasan.so.*|libubsan.so.*) ;;
    *) echo "libvaswap.so depends on $dep, which would join the host's global scope"; exit 1 ;;
  esac
done
if nm -D --defined-only "$lib" | grep -Eq 'spdlog|fmt|YAML|unw_'; then echo "a dependency's symbol is exported"; exit 1; fi
