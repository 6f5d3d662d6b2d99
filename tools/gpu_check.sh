#!/usr/bin/env bash
# The GPU checks that matter most, for a GPU machine lent for minutes (the full suite, `make
# test-gpu`, takes far longer).
#
# The next session with a GPU: one device call does it all. Prepare the checkout on this side with
# ../shared/tools/gpu-prep (its .whl/ carried along), with Horovod's test_torch.py carried as a
# git-ignored file if it is to run too, then make one call of timeout_s 540:
#     source .whl/setup.sh && HOROVOD_TEST_TORCH=.hvd/test_torch.py tools/gpu_check.sh all "$OUT"
# .whl/setup.sh builds hvlite there (about a minute); `all` keeps to GPU_CHECK_BUDGET seconds
# (default 450) from its own start: a step that would not end in what is left is skipped, saying
# so. It prints its summary and the tables the GPU defaults are decided on, and leaves in OUTDIR
# the summary, bench.txt (every table) and two tarballs of logs (a device call brings back at
# most 8 files; the second is remade after each step alone).
#
# all: first, at once on the machine's cores: Horovod's suite on both paths (when
#      HOROVOD_TEST_TORCH names its file); tests/gpu at 1 rank (the defaults: a capture refused, a
#      buffer grown mid-training without a stall, results on external streams) and
#      tools/gpu_matrix.py (each test function of tests/gpu as its own job, 2 ranks, both paths);
#      the experimental switches under the torch and GPU files (NCCL batches left running,
#      HVLITE_NCCL_OVERLAP=1, at 2 and 4 ranks; CUDA tensors held until written,
#      HVLITE_GPU_READY_ONLY=1, at 2 ranks; the staged path in 4 KiB pieces, HVLITE_STAGED_PIECE);
#      and NCCL's first collective failing where its transports connect (NCCL_BUFFSIZE too large
#      to allocate; with 2 GPUs and root, also a 1 MiB /dev/shm, with NCCL_P2P_DISABLE=1 and with
#      NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1): the set must fall back to the staged path, never
#      fail the job. Then, alone on
#      the GPU, the tables the defaults are decided on: ResNet-50's step overhead against DDP's
#      with the defaults, with holding, with overlap, and staged; the staged allreduce whole and in
#      pieces (and its allgather results' copy, pageable against page-locked); then the NCCL
#      table, the lost-rank tests and the held tensor's wake-up, and the test that fills the GPU.
# 1, 2, 3: the older three parts, each within one call: part 1 correctness on both GPU paths,
#      part 2 the failure bounds and the benchmarks, part 3 Horovod's test_torch.py on both paths.
# Without a GPU every step fails or skips, saying why, well inside the budget.
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
    deadline=$((SECONDS + ${GPU_CHECK_BUDGET:-450}))
    P="python3 -m pytest -q -x -p no:cacheprovider"
    fill=tests/gpu/test_nccl_plane.py::test_no_gpu_room_for_results_runs_the_batch_staged
    NCCL="HVLITE_TEST_NCCL_HOSTID=per-rank"
    bg() {          # bg NAME SECONDS COMMAND...: a job of the first phase, its output in $L/NAME.txt
        local name=$1 limit=$2
        shift 2
        (timeout -k 5 "$limit" env "$@" > "$L/$name.txt" 2>&1; echo "rc=$?" >> "$L/$name.txt") &
    }
    if [ -n "${HOROVOD_TEST_TORCH:-}" ]; then
        bg horovod-staged 130 python3 tools/horovod_suite.py "$HOROVOD_TEST_TORCH" --one-gpu --timeout 120 \
            --out "$L/horovod-staged"
        bg horovod-nccl 130 python3 tools/horovod_suite.py "$HOROVOD_TEST_TORCH" --one-gpu --hostid-per-rank \
            --timeout 120 --out "$L/horovod-nccl"
    fi
    bg np1-defaults 70 hvlrun -np 1 $P tests/gpu --deselect $fill
    bg np4-staged 100 hvlrun -np 4 $P tests/gpu/test_cuda_only.py
    bg np4-nccl-overlap 100 $NCCL HVLITE_NCCL_OVERLAP=1 hvlrun -np 4 $P tests/gpu/test_nccl_plane.py --deselect $fill
    bg np2-torch-overlap 130 $NCCL HVLITE_NCCL_OVERLAP=1 HVLITE_TEST_DEVICE=cuda hvlrun -np 2 $P \
        tests/parallel/test_torch_training.py tests/parallel/test_torch_ops.py
    bg np2-gpu-held 120 $NCCL HVLITE_GPU_READY_ONLY=1 hvlrun -np 2 $P tests/gpu/test_nccl_plane.py \
        tests/gpu/test_cuda_only.py --deselect $fill
    bg np2-torch-held 130 HVLITE_GPU_READY_ONLY=1 HVLITE_TEST_DEVICE=cuda hvlrun -np 2 $P \
        tests/parallel/test_torch_training.py tests/parallel/test_torch_ops.py
    bg np2-staged-pieces 130 HVLITE_STAGED_PIECE=4096 HVLITE_TEST_DEVICE=cuda hvlrun -np 2 $P \
        tests/parallel/test_torch_ops.py tests/parallel/test_torch_training.py tests/gpu/test_cuda_only.py
    bg first-collective-fails 120 $P -s -rs tests/test_gpu.py -k first_collective
    timeout 140 python3 tools/gpu_matrix.py --np 2 --jobs 6 --timeout 50 --files tests/gpu/test_cuda_only.py \
        tests/gpu/test_nccl_plane.py --exclude "${fill#*::}" --out "$L/matrix" > /dev/null 2>&1
    wait
    echo "at once: $((SECONDS - start)) s" | tee -a "$summary"
    for f in "$L"/*.txt "$L/matrix/matrix.txt"; do
        [ -f "$f" ] && printf '%-24s %s\n' "$(basename "$f" .txt)" "$(grep -v '^rc=' "$f" | tail -n 1) $(grep '^rc=' "$f")" \
            | tee -a "$summary"
    done
    grep -h "staged path, not NCCL" "$L/first-collective-fails.txt" 2>/dev/null | head -n 2 | tee -a "$summary"
    tar czf "$out/logs-at-once.tgz" -C "$L" . 2>/dev/null
    alone() {       # alone NAME SECONDS COMMAND...: one step, its output appended to bench.txt
        local name=$1 limit=$2 left=$((deadline - SECONDS))
        shift 2
        if [ "$left" -lt 15 ]; then
            printf '%-22s skipped: %ds of the budget left\n' "$name" "$left" | tee -a "$summary"
            return
        fi
        [ "$limit" -gt "$left" ] && limit=$left
        timeout -k 5 "$limit" "$@" > "$L/$name.log" 2>&1
        local rc=$?
        printf '%-22s rc=%-3d %4ds  %s\n' "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$L/$name.log")" \
            | tee -a "$summary"
        { echo "=== $name"; grep -v WARNING "$L/$name.log"; } >> "$out/bench.txt"
        # after each step, so a call cut short by its limit still brings back what ran
        tar czf "$out/logs-alone.tgz" -C "$L" --exclude "./horovod-*" --exclude ./matrix . 2>/dev/null
    }
    : > "$out/bench.txt"
    # first what the GPU defaults are decided on (a call cut short keeps what bench.txt holds so
    # far): ResNet-50's overhead against DDP's (on NCCL, then on gloo for the staged path) with the
    # defaults (batches waited for, CUDA tensors negotiated at submit), with each experimental
    # switch, and staged; the staged table whole and in pieces
    resnet="bench/step_overhead.py --device cuda --models resnet50 --batch-size 64 --planes shm --ddp \
        --pairs 12 --blocks 2"
    alone resnet50-2-defaults 50 hvlrun -np 2 python3 $resnet --hostid-per-rank
    alone resnet50-2-held 50 env HVLITE_GPU_READY_ONLY=1 hvlrun -np 2 python3 $resnet --hostid-per-rank
    alone resnet50-2-overlap 50 env HVLITE_NCCL_OVERLAP=1 hvlrun -np 2 python3 $resnet --hostid-per-rank
    alone resnet50-2-staged 50 hvlrun -np 2 python3 $resnet --ddp-backend gloo
    alone staged-2 30 hvlrun -np 2 python3 bench/gpu_allreduce.py --iters 5
    alone staged-2-pieces 25 env HVLITE_STAGED_PIECE=4194304 hvlrun -np 2 python3 bench/gpu_allreduce.py --iters 5 \
        --no-results
    alone nccl-2 30 hvlrun -np 2 python3 bench/gpu_nccl.py --hostid-per-rank --iters 5
    alone lost 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "lost_inside or killed_rank or once_written"
    alone no-room 35 env HVLITE_TEST_NCCL_HOSTID=per-rank hvlrun -np 2 $P $fill
    echo "all: $((SECONDS - start)) s" | tee -a "$summary"
    # the tables the defaults are decided on, from bench.txt
    echo; echo "==== the tables the GPU defaults are decided on (all of them: $out/bench.txt)"
    for name in resnet50-2-defaults resnet50-2-held resnet50-2-overlap resnet50-2-staged; do
        echo "--- $name"
        grep -A 4 "hvlite DistributedOptimizer vs torch DDP" "$L/$name.log" 2>/dev/null || echo "(no table: see its log)"
    done
    for name in staged-2 staged-2-pieces; do
        echo "--- $name"
        grep -B 1 -A 12 "allreduce of CUDA tensors\|allgather results on their way" "$L/$name.log" 2>/dev/null \
            || echo "(no table: see its log)"
    done
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
