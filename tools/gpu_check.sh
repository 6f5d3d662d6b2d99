#!/usr/bin/env bash
# The GPU checks that matter most, in order, each under its own time limit, for a GPU machine
# lent for minutes (the full suite, `make test-gpu`, takes far longer). Three parts, each within
# one device call (600 s at most, setup included): part 1 is correctness on both GPU paths
# (the staged path first: it serves every machine), part 2 the failure bounds and the
# benchmarks, part 3 Horovod's own test_torch.py on both paths (HOROVOD_TEST_TORCH=its path;
# carry it as a git-ignored file). With 15 minutes of device time in all, run part 1 alone
# first (timeout_s 480), then part 2 or 3 if time is left. Run from the checkout's root after
# ../shared/tools/gpu-prep (its .whl/ carried along):
#     source .whl/setup.sh && tools/gpu_check.sh 1 "$OUT"
# Each step's output goes to OUTDIR/NN-name.log (default: $OUT, else gpu-check/); a summary line
# per step goes to OUTDIR/summary-PART.txt. A step that fails does not stop the next. Each
# step is one test file: a failure stops its job (-x; the SPMD plugin ends every rank), so
# files are kept apart to let the others report.
set -u
part=${1:-1}
case $part in 1|2|3) ;; *) echo "usage: tools/gpu_check.sh 1|2|3 [OUTDIR]" >&2; exit 2 ;; esac
out=${2:-${OUT:-gpu-check}}
mkdir -p "$out"
summary="$out/summary-$part.txt"
: > "$summary"
export HVLITE_SPMD=1 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=${NCCL_DEBUG:-WARN}   # NCCL says why it fails
step() {        # step NAME SECONDS COMMAND...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3d %4ds  %s\n' "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$out/$name.log")" \
        | tee -a "$summary"
}
spmd() { hvlrun -np "$1" python3 -m pytest -q -x -p no:cacheprovider "${@:2}"; }
hostid="env HVLITE_TEST_NCCL_HOSTID=per-rank"
case $part in
1)  # limits: 420 s in all
    step 01-check-build 30 hvlrun --check-build
    step 02-staged-cuda-only-2 75 bash -c "$(declare -f spmd); spmd 2 tests/gpu/test_cuda_only.py"
    step 03-staged-plane-2 45 bash -c "$(declare -f spmd); spmd 2 tests/gpu/test_nccl_plane.py"
    step 04-nccl-plane-2 75 $hostid bash -c "$(declare -f spmd); spmd 2 tests/gpu/test_nccl_plane.py"
    step 05-nccl-cuda-only-2 75 $hostid bash -c "$(declare -f spmd); spmd 2 tests/gpu/test_cuda_only.py"
    step 06-nccl-training-2 120 $hostid HVLITE_TEST_DEVICE=cuda bash -c "$(declare -f spmd); spmd 2 tests/parallel/test_torch_training.py"
    ;;
2)  # limits: 420 s in all (the two jobs of step 07 take seconds; their own limits are larger)
    step 07-lost-rank 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "lost_inside or killed_rank"
    step 08-bench-nccl-2 90 hvlrun -np 2 python3 bench/gpu_nccl.py --hostid-per-rank --iters 5
    step 09-bench-staged-2 90 hvlrun -np 2 python3 bench/gpu_allreduce.py --iters 5
    ;;
3)  # limits: 300 s in all; the work folders stay out of $OUT (hundreds of files). The job's
    # own limit (125 s, then SIGKILL 10 s later) ends before the step's, so the suite still
    # writes its summary
    suite="python3 tools/horovod_suite.py ${HOROVOD_TEST_TORCH:?set HOROVOD_TEST_TORCH} --one-gpu --timeout 125"
    step 10-horovod-staged-2 150 $suite --out /tmp/horovod-staged
    step 11-horovod-nccl-2 150 $suite --hostid-per-rank --out /tmp/horovod-nccl
    ;;
esac
