#!/usr/bin/env bash
# CPU instructions per save (and per step of `run`), counted by valgrind's callgrind.
#
#   bash benchmarks/callgrind.sh [--n N] [--modes memory,sqlite,...] [--before REV] [--json]
#
# Instruction counts do not depend on the machine's load, so this is the figure to
# compare across runs on a noisy machine. Each mode (see benchmarks/_callgrind_driver.py)
# is run twice under callgrind, with N and with 2N operations after the same warm-up;
# (count(2N) - count(N)) / N is the cost of one operation: start-up, imports and warm-up
# cancel out. Counted: user-space instructions of the process (Python, the sqlite3
# library, libc); the kernel's work (the fsync itself, write, rename) is not.
# PYTHONHASHSEED=0 keeps dict layouts, and so the counts, the same from run to run.
#
# --before REV measures stepstone as committed at REV instead of the work tree
# (`git archive REV src` into a temp dir put first on PYTHONPATH; the repository is
# only read). Needs valgrind (apt-get install valgrind).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-$root/.venv/bin/python}"
n=200
modes="memory,sqlite,file,build,sqlite-floor,file-floor,run-memory,plain"
before=""
json=0
while [ $# -gt 0 ]; do
    case "$1" in
        --n) n="$2"; shift 2 ;;
        --modes) modes="$2"; shift 2 ;;
        --before) before="$2"; shift 2 ;;
        --json) json=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 1; }
mkdir -p "$here/.tmp"
work="$(mktemp -d "$here/.tmp/callgrind-XXXXXX")"
trap 'rm -rf "$work"' EXIT
label="work tree"
if [ -n "$before" ]; then
    mkdir -p "$work/src-before"
    git -C "$root" archive "$before" src | tar -x -C "$work/src-before"
    export PYTHONPATH="$work/src-before/src${PYTHONPATH:+:$PYTHONPATH}"
    label="$(git -C "$root" rev-parse --short "$before")"
fi
export PYTHONHASHSEED=0
# Say which stepstone is measured, and refuse another checkout's: a worktree without a
# .venv of its own once measured the main checkout's code through $root/.venv's install.
measured="$("$python" -c 'import os, stepstone; print(os.path.dirname(os.path.dirname(os.path.realpath(stepstone.__file__))))')"
expected="$root/src"
[ -z "$before" ] || expected="$work/src-before/src"
expected="$(realpath "$expected")"
if [ "$measured" != "$expected" ]; then
    echo "callgrind.sh: $python imports stepstone from $measured, not $expected;" \
        "set PYTHONPATH=$expected (or PYTHON=) to measure this tree" >&2
    exit 1
fi
[ "$json" = 1 ] || echo "callgrind: measuring stepstone from $measured with $python" >&2
# Bytecode first: otherwise the N run compiles what changed since the last import and the
# 2N run does not, and (2N - N) / N comes out low, even negative (seen 2026-12-07).
"$python" -m compileall -q "$measured/stepstone" >/dev/null

count() {  # count MODE N -> instructions of the whole process
    local dir="$work/d-$1-$2"
    mkdir -p "$dir"
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$python" \
        "$here/_callgrind_driver.py" "$1" "$2" "$dir" 2>&1 >/dev/null \
        | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
    rm -rf "$dir"
}

per_op() {  # per_op MODE -> instructions per operation
    local a b
    a="$(count "$1" "$n")"
    b="$(count "$1" $((2 * n)))"
    [ -n "$a" ] && [ -n "$b" ] || { echo "callgrind failed for $1" >&2; return 1; }
    echo $(( (b - a) / n ))
}

results=()
for mode in ${modes//,/ }; do
    [ "$json" = 1 ] || echo "callgrind: $mode (N=$n and $((2 * n))) ..." >&2
    v="$(per_op "$mode")"
    results+=("$mode=$v")
done
if [ "$json" = 1 ]; then
    printf '{"figure": "callgrind", "src": "%s", "n": %s, "instructions": {' "$label" "$n"
    sep=""
    for r in "${results[@]}"; do printf '%s"%s": %s' "$sep" "${r%%=*}" "${r#*=}"; sep=", "; done
    printf '}}\n'
else
    echo "instructions per operation (callgrind, $label, N=$n):"
    for r in "${results[@]}"; do
        mode="${r%%=*}"; v="${r#*=}"
        case "$mode" in
            emit|emit-none) printf '  %-13s %12s per event (emit-none: per empty turn)\n' "$mode" "$v" ;;
            run-memory|plain) printf '  %-13s %12s per run of 10 steps = %s per step\n' "$mode" "$v" "$((v / 10))" ;;
            *) printf '  %-13s %12s per save\n' "$mode" "$v" ;;
        esac
    done
fi
