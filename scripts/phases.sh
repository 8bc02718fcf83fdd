# Sourced helper: run named phases, time them, print a table at the end.
# Usage: phase NAME CMD...; then phase_report (returns the first failure's status).
_phase_names=(); _phase_secs=(); _phase_rc=(); _phase_fail=0
# The machine's load, so a failure can be read against it: load averages over 1/5/15 min,
# runnable/all tasks, cores; at a phase's end also the CPU busy share during it (all cores).
_cpu_busy() {  # prints "busy total" jiffies since boot
  local cpu user nice sys idle iowait irq softirq steal rest
  read -r cpu user nice sys idle iowait irq softirq steal rest </proc/stat
  echo "$((user + nice + sys + irq + softirq + steal)) $((user + nice + sys + irq + softirq + steal + idle + iowait))"
}
machine_load() {  # [busy0 total0]: the CPU share since then
  local pct=""
  if (($# == 2)); then
    local b t
    read -r b t <<<"$(_cpu_busy)"
    ((t > $2)) && pct=", cpu busy $(((b - $1) * 100 / (t - $2)))% during the phase"
  fi
  echo "load $(cut -d' ' -f1-4 /proc/loadavg), $(nproc) cores$pct"
}
phase() {
  local name=$1; shift
  echo "=== phase: $name: $*"
  echo "=== phase: $name: start: $(machine_load)"
  local t0 rc cpu0
  t0=$(date +%s.%N)
  cpu0=$(_cpu_busy)
  "$@"; rc=$?
  # shellcheck disable=SC2086
  echo "=== phase: $name: end (rc $rc): $(machine_load $cpu0)"
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

