#!/usr/bin/env bash
# DESIGN.md invariant 9: libvaswap.so exports only vaswap_* (and, later, the CUDA entry points it
# interposes), and nothing it depends on can leak symbols into the host: yaml-cpp and libunwind
# are reached only through libvaswap_yaml.so / libvaswap_unwind.so, loaded RTLD_LOCAL.
set -euo pipefail
lib=$1/lib/libvaswap.so
allowed='^(vaswap_[a-z0-9_]+)$'
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | grep -Ev "$allowed" || true)
if [[ -n "$bad" ]]; then echo "libvaswap.so exports symbols outside the allowed set:"; echo "$bad"; exit 1; fi
needed=$(readelf -d "$lib" | awk '/NEEDED/ {print $5}' | tr -d '[]')
echo "exports: $(nm -D --defined-only "$lib" | wc -l) symbols; NEEDED: ${needed:-none}"
for dep in $needed; do
  case "$dep" in
    libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libdl.so.*|libpthread.so.*|ld-linux*|libasan.so.*|libubsan.so.*) ;;
    *) echo "libvaswap.so depends on $dep, which would join the host's global scope"; exit 1 ;;
  esac
done
if nm -D --defined-only "$lib" | grep -Eq 'spdlog|fmt|YAML|unw_'; then echo "a dependency's symbol is exported"; exit 1; fi
