# Sourced helper: run named phases, time them, print a table at the end.
# Usage: phase NAME CMD...; then phase_report (returns the first failure's status).
_phase_names=(); _phase_secs=(); _phase_rc=(); _phase_fail=0
phase() {
  local name=$1; shift
  echo "=== phase: $name: $*"
  local t0 rc
  t0=$(date +%s.%N)
  "$@"; rc=$?
  _phase_names+=("$name")
  _phase_secs+=("$(echo "$(date +%s.%N) - $t0" | bc)")
  _phase_rc+=("$rc")
  if ((rc != 0)) && ((_phase_fail == 0)); then _phase_fail=$rc; fi
  return $rc
}
phase_report() {
  local title=${1:-phases}
  printf '\n%-22s %9s  %s\n' "$title" "seconds" "result"
  local i
  for i in "${!_phase_names[@]}"; do
    printf '%-22s %9.1f  %s\n' "${_phase_names[$i]}" "${_phase_secs[$i]}" \
      "$([ "${_phase_rc[$i]}" = 0 ] && echo ok || echo "FAILED (${_phase_rc[$i]})")"
  done
  return $_phase_fail
}
