#!/usr/bin/env bash
# The source trees of `python -m scfs.bench.ab`: each commit's scfs/, conf/ and csrc/ (the CUDA search kernels
# the GPU step builds) exported with git archive into .ab/<short hash>/ at the repository root, an existing one
# replaced. Export both sides, the current HEAD too, so both run from the same kind of copy. .ab/ is git-ignored:
# the trees travel to a GPU machine as a carried ignored path (carry .ab), and there, from the repository root:
#
#   python -m scfs.bench.ab --tree A=.ab/<a> --tree B=.ab/<b> --rounds 3 -- --batch 64 --setting bf16_cl --no-ceiling
#
# A commit may be given by any name git knows (HEAD, a branch); its folder and label are its short hash, so the
# record names the code it measured. Prints each tree's folder, the total size and, for two commits, the command.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: scripts/ab_trees.sh <commit> [<commit> ...]" >&2
  exit 2
fi
ROOT=$(git rev-parse --show-toplevel)
shas=()
for c in "$@"; do
  if ! sha=$(git -C "$ROOT" rev-parse --verify --quiet --short "$c^{commit}"); then
    echo "ab_trees: $c: not a commit" >&2; exit 2
  fi
  paths=()
  for p in scfs conf csrc; do
    if git -C "$ROOT" cat-file -e "$sha:$p" 2>/dev/null; then paths+=("$p"); fi
  done
  if [ "${paths[0]:-}" != scfs ] || [ "${paths[1]:-}" != conf ]; then
    echo "ab_trees: $c ($sha) has no scfs/ and conf/ to export" >&2; exit 2
  fi
  rm -rf "$ROOT/.ab/$sha"; mkdir -p "$ROOT/.ab/$sha"
  git -C "$ROOT" archive "$sha" "${paths[@]}" | tar -x -C "$ROOT/.ab/$sha"
  echo "$c: .ab/$sha (${paths[*]})"
  shas+=("$sha")
done
du -sh "$ROOT/.ab" | awk '{print "total: " $1 " in .ab/"}'
if [ ${#shas[@]} -eq 2 ]; then
  echo "python -m scfs.bench.ab --tree ${shas[0]}=.ab/${shas[0]} --tree ${shas[1]}=.ab/${shas[1]} --rounds 3" \
       "-- --batch 64 --setting bf16_cl --no-ceiling"
fi
