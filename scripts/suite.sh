# Sourced by scripts/test.sh and scripts/test-long.sh: pytest phases, the slowest tests, the
# leak check against the census taken when the run started.
source scripts/phases.sh
# A phase that collects no test fails (pytest's exit 5): its tests went missing. Each phase
# prints the reason of every skip (-rfEs: s the skips; f and E keep the failures and errors
# listed, which a bare -rs would drop) and its ten slowest tests; slowest_report lists the ten
# slowest of the whole run from each phase's JUnit XML. With AENV_STRICT_SKIPS=1 (.ci/run) a
# skip whose reason is not on the list in tests/support/skips.py fails the run
# (docs/testing.md, "Skips").
_junit_dir=$(mktemp -d /tmp/aenv-junit.XXXXXX)
_census_baseline=$(mktemp /tmp/aenv-census-baseline.XXXXXX.json)
# The last run's JUnit XML stays in /var/tmp/aenv-junit-last (every test's time, for when
# a log was cut).
trap 'rm -rf /var/tmp/aenv-junit-last; cp -r "$_junit_dir" /var/tmp/aenv-junit-last 2>/dev/null
      rm -rf "$_junit_dir" "$_census_baseline"' EXIT
pyt() {  # NAME PYTEST-ARGS...
  local name=$1; shift
  .venv/bin/python -m pytest -q -rfEs -p no:cacheprovider --durations=10 \
    --junitxml="$_junit_dir/$name.xml" "$@"
}
slowest_report() {
  .venv/bin/python - "$_junit_dir" <<'PY'
import sys, xml.etree.ElementTree as ET
from pathlib import Path
rows = []
for f in sorted(Path(sys.argv[1]).glob("*.xml")):
    for case in ET.parse(f).iter("testcase"):
        rows.append((float(case.get("time", 0)), f.stem, f"{case.get('classname')}::{case.get('name')}"))
print(f"\n{'ten slowest tests':<22} {'seconds':>9}  phase: test")
for t, phase, name in sorted(rows, reverse=True)[:10]:
    print(f"{'':<22} {t:9.1f}  {phase}: {name}")
# Each failure's message and where it was raised, at the end where a truncated log still
# shows them (the phase's own report is far above).
for f in sorted(Path(sys.argv[1]).glob("*.xml")):
    for case in ET.parse(f).iter("testcase"):
        for bad in (*case.iter("failure"), *case.iter("error")):
            where = [ln for ln in (bad.text or "").splitlines() if ln.startswith(("tests/", "src/"))]
            print(f"\n{bad.tag}: {f.stem}: {case.get('classname')}::{case.get('name')} "
                  f"({where[-1] if where else '?'})\n  {(bad.get('message') or '')[:600]}")
PY
}
# What an earlier run that was killed part-way left on this host (a shared CI machine):
# reported by the leak check at the end, not counted against this run.
census_baseline() {
  .venv/bin/python -m aenv.cli.main census --strict --json >"$_census_baseline" 2>/dev/null || true
  [ -s "$_census_baseline" ] || echo "{}" >"$_census_baseline"
}
leak_check() { bash scripts/leak-check.sh --baseline "$_census_baseline"; }
