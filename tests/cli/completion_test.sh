#!/usr/bin/env bash
# The bash completion of `spritetorch completion bash`: sourced into bash, its function is called
# the way bash calls it (COMP_WORDS / COMP_CWORD) and must offer the real commands and flags.
#   completion_test.sh path/to/spritetorch
set -uo pipefail
cli=$1
script=$("$cli" completion bash) || { echo "FAIL: spritetorch completion bash exited $?"; exit 1; }
eval "$script"
failures=0

# complete WORD... : runs the completion with the cursor on the last word; prints the candidates.
complete_words() {
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _spritetorch
  printf '%s\n' "${COMPREPLY[@]}"
}
expect() {  # expect "WORDS" EXPECTED: the candidates are exactly EXPECTED (space-separated, sorted)
  local got
  got=$(complete_words $1 | sort | paste -sd ' ' -)
  if [ "$got" != "$2" ]; then
    echo "FAIL: completing '$1': expected '$2', got '$got'"
    failures=$((failures + 1))
  else
    echo "ok  '$1' -> $got"
  fi
}
# Candidates are captured before grep looks at them: `complete_words ... | grep -q` under pipefail
# fails whenever grep exits on its match before printf has written the rest (SIGPIPE): flaky.
expect_has() {  # expect_has "WORDS" CANDIDATE
  if ! grep -qx -- "$2" <<<"$(complete_words $1)"; then
    echo "FAIL: completing '$1': '$2' not offered"
    failures=$((failures + 1))
  else
    echo "ok  '$1' offers $2"
  fi
}

expect "spritetorch tr" "train"
expect "spritetorch train --epo" "--epochs"
expect "spritetorch ex" "export"
expect "spritetorch export --for" "--format"
expect "spritetorch import --mod" "--model"
expect "spritetorch data pre" "preview"
expect "spritetorch --vers" "--version"
grep -qx completion <<<"$(complete_words spritetorch "")" || { echo "FAIL: 'spritetorch ' does not offer completion"; failures=$((failures + 1)); }
expect_has "spritetorch train --model ann --l" "--lr"
# After a flag that takes a value, the next word is a value (files), not a flag or a command.
tmp=$(mktemp -d)
touch "$tmp/weights.safetensors"
expect "spritetorch export --checkpoint $tmp/wei" "$tmp/weights.safetensors"
rm -rf "$tmp"
# A flag without a value (--json, --overwrite, --help) does not eat the next word.
expect "spritetorch train --json --epo" "--epochs"
expect "spritetorch export --overwrite --for" "--format"
expect "spritetorch --help da" "data"
# A command's own words: completion's shell, nothing for devices (no files), and a whole command
# again after launch's --.
[ "$(complete_words spritetorch completion "" | paste -sd ' ' -)" = bash ] || { echo "FAIL: 'spritetorch completion ' does not offer just bash"; failures=$((failures + 1)); }
[ -z "$(complete_words spritetorch devices "")" ] || { echo "FAIL: 'spritetorch devices ' offers words: it takes none"; failures=$((failures + 1)); }
expect "spritetorch launch --nproc-per-node 2 -- tr" "train"
expect "spritetorch launch --nproc-per-node 2 -- train --epo" "--epochs"
# A flag with a list of values offers them.
expect "spritetorch train --optimizer ada" "adam adamw"
expect "spritetorch data preview --split t" "test train"
# Every flag of every command in --help is offered: the script comes from the same table.
# (Option names only: the first column of each option line, not flags quoted in descriptions.)
flags=$("$cli" train --help | grep -E -- '^ +(-[a-zA-Z], )?--[a-z]' | sed -E 's/^ +(-[a-zA-Z], )?(--[a-z][a-z0-9-]+).*/\2/' | sort -u)
[ -n "$flags" ] || { echo "FAIL: no flags in train --help"; failures=$((failures + 1)); }
for flag in $flags; do
  grep -qx -- "$flag" <<<"$(complete_words spritetorch train "${flag:0:5}")" ||
    { echo "FAIL: 'spritetorch train ${flag:0:5}' does not offer $flag"; failures=$((failures + 1)); }
done
echo "ok  every flag of train --help is offered ($(wc -w <<< "$flags") flags)"
grep -q "complete -F _spritetorch spritetorch" <<< "$script" || { echo "FAIL: no complete line"; failures=$((failures + 1)); }
"$cli" completion zsh > /dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: an unknown shell must be a usage error (exit 2)"; failures=$((failures + 1)); }

[ "$failures" -eq 0 ] && echo "PASS" || { echo "$failures failure(s)"; exit 1; }
