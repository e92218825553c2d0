#!/usr/bin/env bash
# The forty-fourth session's look at the pytest worker crash (NOTES "The pytest worker crash":
# a CPU test's stub kernel pointer, 1, left in _staged_cl_kernel's cache and launched by a
# later GPU test of the same worker; tests/conftest.py _forget_device_stubs mends it).
# Steps (default: replay rounds):
#   probes   the query alone, the query again after cooperative launches, the test's rebuild
#            rounds, the replay with the occupancy cache kept across drop_modules, and
#            cuda-gdb's backtrace of the replay's crash (run once, before the mend)
#   memo     whether CuPy reuses a module for the same source and options
#   replay   the three crashing workers' orders (forty-third session's, and two of the
#            forty-fourth's), each in one process
#   rounds   the BatchNorm test file under 8 workers, three rounds
#   trace    the replayed order with each occupancy query and cooperative launch traced
#            (probe_bn_trace.py)
#   handles  the replayed order with every kernel handle's attributes read again after each
#            test (probe_bn_handles.py): the test that breaks one
# Results under $OUT (or ./occupancy-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-occupancy-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
order=benchmarks/results/crash-bn-43-h100-order.txt
run() { local name="$1" limit="$2"; shift 2; local t=$SECONDS
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1; echo "== $name rc $? ($((SECONDS - t)) s)"
    grep -v "^  File\|^Extension\|^\.\.\.*\$" "$out/$name.txt" | grep -m8 "rounds\|query\|moved\|memo\|passed\|failed\|Fatal\|Current thread\|line [0-9]* in"; }
replay() {  # replay NAME PYTHON-PREAMBLE: the crashing order in one process after the preamble
    run "$1" 150 python3 -c "import sys, pytest; from cunorm import _compile, _launch; $2; \
sys.exit(pytest.main(['-q', '-p', 'no:xdist', '-p', 'no:cacheprovider', *open('$order').read().split()]))"; }
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(replay rounds)
for s in "${steps[@]}"; do
    case "$s" in
    probes)
        for mode in query_only:2000 requery:300 rebuilt:30; do
            run "probe-${mode%%:*}" 90 python3 benchmarks/probe_bn_occupancy.py "${mode%%:*}" "${mode##*:}"
        done
        replay replay-keep-occupancy "_compile._pointer_caches.remove(_launch.max_active_clusters)"
        run replay-gdb 240 cuda-gdb -q -batch -ex "set pagination off" -ex "set cuda break_on_launch none" -ex run \
            -ex bt -ex "info registers rip rdi rsi rdx rax rbx" -ex "x/12i \$pc-24" -ex "info symbol \$pc" \
            --args python3 -m pytest -q -p no:xdist -p no:cacheprovider $(cat $order)
        grep -A30 "SIGSEGV" "$out/replay-gdb.txt" | head -60 ;;
    memo) run probe-memo 60 python3 benchmarks/probe_bn_occupancy.py memo 1 ;;
    replay)
        for o in $order benchmarks/results/crash-bn-44-h100-order-a.txt benchmarks/results/crash-bn-44-h100-order-b.txt; do
            run "replay-$(basename $o .txt)" 150 python3 -m pytest -q -p no:xdist -p no:cacheprovider $(cat $o)
        done ;;
    trace)
        run trace 150 python3 benchmarks/probe_bn_trace.py $order
        grep "TRACE" "$out/trace.txt" | tail -30 ;;
    handles)
        run handles 200 python3 benchmarks/probe_bn_handles.py $order
        grep "CHECK BROKEN" "$out/handles.txt" | head -5; grep "CHECK" "$out/handles.txt" | tail -6 ;;
    rounds)
        for r in 1 2 3; do run "rounds-$r" 90 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_batch_norm.py; done ;;
    esac
done
