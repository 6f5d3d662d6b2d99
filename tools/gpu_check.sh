#!/usr/bin/env bash
# The GPU checks that matter most, for a GPU machine lent for minutes (the full suite, `make
# test-gpu`, takes far longer). Run from the checkout's root after ../shared/tools/gpu-prep (its
# .whl/ carried along), e.g. with Horovod's test_torch.py carried as a git-ignored file:
#     source .whl/setup.sh && HOROVOD_TEST_TORCH=.hvd/test_torch.py tools/gpu_check.sh all "$OUT"
# all: everything below in one call (269 s on an H200, 2026-11-28, before the overlap runs were
#      added: about 570 s now, by estimate, so timeout_s 600; the steps that decide defaults come
#      first, so a call cut short loses only the last ones): first, at once on the machine's cores,
#      Horovod's suite on both paths (when HOROVOD_TEST_TORCH names its file), tests/gpu at 1
#      rank, with NCCL batches left running (HVLITE_NCCL_OVERLAP=1) the NCCL file at 4 ranks and
#      the torch and GPU files at 2, and tools/gpu_matrix.py (each test function of tests/gpu as
#      its own job, 2 ranks, both paths, batches waited for), and the staged torch and GPU files
#      at 2 ranks in 4 KiB pieces (HVLITE_STAGED_PIECE); then, alone on the GPU, first what
#      the defaults are decided on (ResNet-50 four ways, the staged table whole and in 4 MiB
#      pieces), then the NCCL table at 2 ranks, the test that fills the GPU, the lost-rank tests
#      (both ways) and the held tensor's wake-up (long cycles), the NCCL table at 4 ranks, a timeline of a few overlapped steps and the
#      staged table at 4 ranks. Logs go to
#      OUTDIR as two tarballs (what a device call brings back is at most 8 files; the second
#      remade after each step alone) and the benchmark tables to OUTDIR/bench.txt.
# 1, 2, 3: the older three parts, each within one call: part 1 correctness on both GPU paths,
#      part 2 the failure bounds and the benchmarks, part 3 Horovod's test_torch.py on both paths.
# Each step's output goes to OUTDIR (default: $OUT, else gpu-check/); a summary line per step
# goes to OUTDIR/summary-PART.txt. A step that fails does not stop the next.
set -u
part=${1:-1}
case $part in 1|2|3|all) ;; *) echo "usage: tools/gpu_check.sh 1|2|3|all [OUTDIR]" >&2; exit 2 ;; esac
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
if [ "$part" = all ]; then
    L=$(mktemp -d); start=$SECONDS
    P="python3 -m pytest -q -x -p no:cacheprovider"
    fill=tests/gpu/test_nccl_plane.py::test_no_gpu_room_for_results_runs_the_batch_staged
    if [ -n "${HOROVOD_TEST_TORCH:-}" ]; then
        (timeout 140 python3 tools/horovod_suite.py "$HOROVOD_TEST_TORCH" --one-gpu --timeout 130 \
            --out "$L/horovod-staged" > "$L/horovod-staged.txt" 2>&1) &
        (timeout 140 python3 tools/horovod_suite.py "$HOROVOD_TEST_TORCH" --one-gpu --hostid-per-rank \
            --timeout 130 --out "$L/horovod-nccl" > "$L/horovod-nccl.txt" 2>&1) &
    fi
    (timeout 60 hvlrun -np 1 $P tests/gpu --deselect $fill > "$L/np1.txt" 2>&1
     timeout 100 hvlrun -np 4 $P tests/gpu/test_cuda_only.py > "$L/np4-staged.txt" 2>&1) &
    # NCCL batches left running (HVLITE_NCCL_OVERLAP=1) at 4 ranks, and at 2 under the torch
    # files and the GPU files; the matrix below runs them as waited for
    (HVLITE_TEST_NCCL_HOSTID=per-rank HVLITE_NCCL_OVERLAP=1 timeout 90 hvlrun -np 4 $P \
        tests/gpu/test_nccl_plane.py --deselect $fill > "$L/np4-nccl-overlap.txt" 2>&1) &
    (HVLITE_TEST_NCCL_HOSTID=per-rank HVLITE_NCCL_OVERLAP=1 HVLITE_TEST_DEVICE=cuda timeout 130 hvlrun -np 2 $P \
        tests/parallel/test_torch_training.py tests/parallel/test_torch_ops.py > "$L/np2-nccl-torch-overlap.txt" 2>&1) &
    (HVLITE_TEST_NCCL_HOSTID=per-rank HVLITE_NCCL_OVERLAP=1 timeout 100 hvlrun -np 2 $P tests/gpu/test_nccl_plane.py \
        tests/gpu/test_cuda_only.py --deselect $fill > "$L/np2-gpu-overlap.txt" 2>&1) &
    # the staged path in pieces (HVLITE_STAGED_PIECE): 4 KiB pieces split the tests' tensors and
    # fused batches across entries
    (HVLITE_STAGED_PIECE=4096 HVLITE_TEST_DEVICE=cuda timeout 130 hvlrun -np 2 $P tests/parallel/test_torch_ops.py \
        tests/parallel/test_torch_training.py tests/gpu/test_cuda_only.py > "$L/np2-staged-pieces.txt" 2>&1) &
    timeout 140 python3 tools/gpu_matrix.py --np 2 --jobs 6 --timeout 50 --files tests/gpu/test_cuda_only.py \
        tests/gpu/test_nccl_plane.py --exclude "${fill#*::}" --out "$L/matrix" > /dev/null 2>&1
    wait
    echo "at once: $((SECONDS - start)) s" | tee -a "$summary"
    for f in "$L"/*.txt "$L/matrix/matrix.txt"; do
        [ -f "$f" ] && printf '%-22s %s\n' "$(basename "$f")" "$(tail -n 1 "$f")" | tee -a "$summary"
    done
    tar czf "$out/logs-at-once.tgz" -C "$L" . 2>/dev/null
    alone() {       # alone NAME SECONDS COMMAND...: one step, its output appended to bench.txt
        local name=$1 limit=$2
        shift 2
        timeout "$limit" "$@" > "$L/$name.log" 2>&1
        local rc=$?
        printf '%-22s rc=%-3d %4ds  %s\n' "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$L/$name.log")" \
            | tee -a "$summary"
        grep -v WARNING "$L/$name.log" >> "$out/bench.txt"
        # after each step, so a call cut short by its limit still brings back what ran
        tar czf "$out/logs-alone.tgz" -C "$L" --exclude "./horovod-*" --exclude ./matrix . 2>/dev/null
    }
    : > "$out/bench.txt"
    # first what this stop's defaults are decided on (a call cut short by its limit keeps what
    # bench.txt holds so far): ResNet-50 four ways, the staged table whole and in pieces
    # ResNet-50's overhead against DDP's (on NCCL, then on gloo for the staged path): batches
    # waited for, left running (HVLITE_NCCL_OVERLAP=1), and CUDA tensors negotiated as soon as
    # submitted instead of once the GPU wrote them (HVLITE_GPU_READY_ONLY=0, as before stop 37)
    resnet="bench/step_overhead.py --device cuda --models resnet50 --batch-size 64 --planes shm --ddp \
        --pairs 18 --blocks 3"
    alone resnet50-2-nccl 75 hvlrun -np 2 python3 $resnet --hostid-per-rank
    alone resnet50-2-overlap 75 env HVLITE_NCCL_OVERLAP=1 hvlrun -np 2 python3 $resnet --hostid-per-rank
    alone resnet50-2-nccl-unheld 75 env HVLITE_GPU_READY_ONLY=0 hvlrun -np 2 python3 $resnet --hostid-per-rank
    alone resnet50-2-staged 75 hvlrun -np 2 python3 $resnet --ddp-backend gloo
    alone staged-2 30 hvlrun -np 2 python3 bench/gpu_allreduce.py --iters 5
    alone staged-2-pieces 30 env HVLITE_STAGED_PIECE=4194304 hvlrun -np 2 python3 bench/gpu_allreduce.py --iters 5
    alone nccl-2 40 hvlrun -np 2 python3 bench/gpu_nccl.py --hostid-per-rank --iters 5
    alone no-room 40 env HVLITE_TEST_NCCL_HOSTID=per-rank hvlrun -np 2 $P $fill
    alone lost 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "lost_inside or killed_rank or once_written"
    alone nccl-4 50 hvlrun -np 4 python3 bench/gpu_nccl.py --hostid-per-rank --iters 3
    # where a step's time goes with overlap: rank 0's timeline of a few steps (in logs-alone.tgz)
    alone resnet50-2-timeline 60 env HVLITE_NCCL_OVERLAP=1 HVLITE_TIMELINE="$L/resnet50-overlap-timeline.json" \
        hvlrun -np 2 python3 bench/step_overhead.py --device cuda --models resnet50 --batch-size 64 \
        --planes shm --hostid-per-rank --pairs 6 --blocks 1
    alone staged-4 30 hvlrun -np 4 python3 bench/gpu_allreduce.py --iters 5
    exit 0
fi

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
