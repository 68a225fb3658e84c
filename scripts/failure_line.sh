# Sourced by the device scripts: `failure_line LOG` prints the line of a failed command's log that says why, as
# scfs.errors.failure_line does (tests/reliability/test_failure_line.py holds both to the same cases): its CLI's
# one-line error, else the last exception line of a traceback, else its last line that is not a progress bar. In
# shell, so that it needs neither the project nor an interpreter that can import it.
failure_line() {
  local text hit
  text=$(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$1" 2>/dev/null | grep -v '^$')
  hit=$(printf '%s\n' "$text" | grep -E '^[[:alnum:]_.]+: (config )?error: ' | tail -n 1)
  [ -n "$hit" ] || hit=$(printf '%s\n' "$text" \
    | grep -E '^([A-Za-z_][[:alnum:]_]*\.)*[A-Z][[:alnum:]_]*(Error|Exception|Interrupt|Exit)\b(: |$)' | tail -n 1)
  [ -n "$hit" ] || hit=$(printf '%s\n' "$text" | grep -Ev '[0-9]+/[0-9]+ \[[0-9:<?]+' | tail -n 1)
  [ -n "$hit" ] || hit=$(printf '%s\n' "$text" | tail -n 1)
  printf '%s' "${hit:0:500}"
}
