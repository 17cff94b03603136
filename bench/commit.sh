# Sourced by the bench scripts: bench_commit prints the commit a results file should name.
# On the device machine the working tree is a copy whose git state is not this checkout's, so
# the caller passes the commit it built: VASWAP_COMMIT=$(git rev-parse --short HEAD) (with
# "+changes" where the tree differs from it). Without it, git's answer, marked as such.
bench_commit() {
  if [[ -n "${VASWAP_COMMIT:-}" ]]; then
    echo "$VASWAP_COMMIT"
  else
    echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown) (git in the run's tree; VASWAP_COMMIT unset)"
  fi
}
