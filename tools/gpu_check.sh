#!/usr/bin/env bash
# The GPU checks that matter most, in order, each under its own time limit, for a GPU machine
# lent for minutes (the full suite, `make test-gpu`, takes far longer). Run from the checkout's
# root after ../shared/tools/gpu-prep (its .whl/ carried along):
#     source .whl/setup.sh && tools/gpu_check.sh [OUTDIR]
# Each step's output goes to OUTDIR/NN-name.log (default: $OUT, else gpu-check/); a summary line
# per step goes to OUTDIR/summary.txt. A step that fails does not stop the next.
set -u
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
export HVLITE_SPMD=1 NCCL_SOCKET_IFNAME=lo
step() {        # step NAME SECONDS COMMAND...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3d %4ds  %s\n' "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$out/$name.log")" \
        | tee -a "$summary"
}
spmd() { hvlrun -np "$1" python3 -m pytest -q -x -p no:cacheprovider "${@:2}"; }
step 01-check-build 60 hvlrun --check-build
step 02-nccl-2-hostid 150 env HVLITE_TEST_NCCL_HOSTID=per-rank bash -c "$(declare -f spmd); spmd 2 tests/gpu/test_nccl_plane.py"
step 03-staged-2-shared 150 bash -c "$(declare -f spmd); spmd 2 tests/gpu/test_nccl_plane.py tests/gpu/test_cuda_only.py"
step 04-nccl-cuda-only-2 150 env HVLITE_TEST_NCCL_HOSTID=per-rank bash -c "$(declare -f spmd); spmd 2 tests/gpu/test_cuda_only.py"
step 05-lost-rank 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "lost_inside or killed_rank"
step 06-bench-nccl-2 150 hvlrun -np 2 python3 bench/gpu_nccl.py --hostid-per-rank --iters 5
step 07-bench-staged-2 150 hvlrun -np 2 python3 bench/gpu_allreduce.py --iters 5
