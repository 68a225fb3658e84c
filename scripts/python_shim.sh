# Sourced by the device scripts: `python_shim DIR` makes `python` (what the README's commands say) this machine's
# interpreter ($PY, python3 by default) by a wrapper in DIR put first on PATH; `timeout` finds it too (it execs a
# binary). A wrapper, not a link: a venv's interpreter linked from elsewhere loses its venv.
python_shim() {
  mkdir -p "$1" && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "${PY:-python3}")" > "$1/python" \
    && chmod +x "$1/python" && export PATH="$1:$PATH"
}
