# Sourced by the CLI's shell tests. Needs $bin; keeps the counters `passes` and `fails`.
# expect CODE PATTERN -- ARGS...: exit code CODE and stdout+stderr matching PATTERN (grep -E), and
# never a LibTorch stack trace.
passes=0 fails=0
expect() {
  local code=$1 pattern=$2
  shift 3
  local out rc
  out=$("$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: spritetorch $* -> exit $rc (wanted $code, /$pattern/), output:"; echo "$out" | tail -20
    fails=$((fails + 1))
  elif grep -q "Exception raised from\|frame #" <<<"$out"; then
    echo "FAIL: spritetorch $* printed a stack trace"; fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}
