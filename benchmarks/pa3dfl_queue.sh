#!/usr/bin/env bash
# The runs issue 24 (Pa3dFL's Table 1 and Table 3, Fashion-MNIST) still needs, in the issue's
# order, in two lanes that share the machine's cores:
#
# - the attack lane: IG on uploads (benchmarks/pa3dfl_leakage.py), one step after another. IG
#   runs on one torch thread by design (bitwise repeatable, flcore/attacks/evaluation.py), so it
#   holds one core;
# - the training lane: Table 1's runs, one at a time, each run's clients spread over worker
#   processes (the results do not depend on the worker count, flcore/executor.py): WORKERS
#   (default 2, one per core of a 2-core machine) less one while the attack lane runs. When the
#   attack lane ends mid-run, the run is stopped cleanly (SIGTERM: the round under way ends and
#   is checkpointed) and resumed at once with all WORKERS.
#
# Start it in the background, niced:
#
#     (setsid nohup nice -n 10 bash benchmarks/pa3dfl_queue.sh >> ~/pa3dfl-queue.log 2>&1 &)
#
# `nice` alone does not make it yield: under the kernel's autogroups
# (/proc/sys/kernel/sched_autogroup_enabled = 1) the CPU is shared equally between sessions
# (setsid makes one) whatever their processes' nice values, so one busy shell beside the queue
# took a core of two and left the queue's two workers the other (session 69). When the queue
# leads its own session it renices that session too (AUTOGROUP_NICE, default 10; empty: leave
# it as it is). To give the queue the machine instead, renice your own session:
# `echo 19 > /proc/$$/autogroup` in your shell.
#
# Every step is resumable: a run resumes from its last checkpoint under
# ~/.cache/fedsweep-runs/pa3dfl/ (every 5 rounds, and on SIGTERM), an IG attack from its state
# (saved every minute), and a run or case that ended, there or on another machine (its record
# under benchmarks/records/), is not run again. So after any interruption (a stop, a machine that
# was laid anew: `make install-dev data` first, which the queue checks before any step) start it
# again: it passes over what ended and goes on. A step that fails is logged with its exit status
# and its lane goes on. To stop it: `kill -- -<its process group>`
# (SIGTERM to the lanes' shells and the Python processes: each run checkpoints first).
# `bash benchmarks/pa3dfl_queue.sh --list` prints the steps, lane by lane.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORKERS=${WORKERS:-2}
# {W}: the worker count, chosen when the step (re)starts
# The runs that start from session 68 on measure the global model on the global test set every
# 10th round (global_accuracy, a diagnostic Table 1 does not use; 12% of a Hetero FjORD round,
# BENCHMARKS.md session 68): training and every client figure are the same
T1="$PY benchmarks/reproduce_pa3dfl_table1.py --workers {W} --global-eval-every 10"
IG="$PY benchmarks/pa3dfl_leakage.py"

# Ended since (kept for their records' sake: a step that ended passes over its runs at once):
# phase 1's Pa3dFL Ideal cell and Algorithm 1's selection on it; phase 2, Table 3's ablation with
# FLANC's decomposition (Hetero, 500 rounds); phase 3's Hetero runs at 200 rounds.
#
# Training lane, in the issue's order:
# 1. phase 3: the other methods at 200 rounds (labelled r200, never compared with the paper's
#    500): FLANC and TailorFL Hetero again under today's code (their runs of sessions 28-29
#    logged no per-width curve and kept no best state, so they have no worst-width window and no
#    client-by-client pairing with Pa3dFL, which the Hetero ordering claim needs), then Ideal;
# 2. phase 4: seeds 1-2 of phase 1 (whether Pa3dFL's Ideal miss is within seed noise), the
#    shortest first, since a machine laid anew between sessions keeps only what ended inside
#    one (3 h): Hetero FjORD seed 1 (its checkpoint, if the machine kept it) takes 21-24 s a
#    round on both cores of a 2-vCPU AMD EPYC (session 69), 2.5-2.9 h to an early stop like seed
#    0's at round 433; both workers ran Hetero FjORD no faster than one Intel thread had (22 s),
#    so seed 0's Intel rounds (one worker) are the estimate for the rest: Ideal FedAvg 36 s x
#    247 rounds, about 2.5 h; Ideal FjORD 40 s x 403, about 4.5 h, and Ideal Pa3dFL, 4.6 h on
#    both cores, cannot end inside one session; the last step passes over every run the ones
#    before it ended. Hetero FjORD seed 2 goes before Ideal FedAvg seed 2 since session 71: it
#    gives FjORD's figure on seed 2's width-1/16 client, the one Pa3dFL serves worst;
# 3. then the labelled variants, diagnoses beyond the issue's runs (after them since session 55):
#    Hetero seed 2 under `width_draw: upto` (every client trains narrower widths too: does it
#    lift the narrowest clients, BENCHMARKS.md sessions 69-71; started by hand in session 71:
#    a run another process holds is left to it, benchmarks/_runs.py run_lock), hn_lr 1.0 and
#    Table 7's hn_lr 0.1 under the paper's plain HN step, which test the Ideal cell's slow start
#    (BENCHMARKS.md sessions 50 and 53), and Algorithm 2's p_min with the step capped;
# 4. then the Hetero ordering's other two at the paper's 500 rounds, seed 0 (phase 3 ran them at
#    200, which the summary's ordering verdict does not count): FLANC as configured, and HeteroFL
#    with static BN (Table 4's BN-free CNN diverges under it, labelled sbn as at 200 rounds).
TRAIN=(
  "$T1 --methods pa3dfl --settings ideal --seeds 0"
  "$PY benchmarks/pa3dfl_selection.py --settings ideal --seeds 0"
  "$T1 --ablation flanc-dec --settings hetero --seeds 0"
  "$PY benchmarks/pa3dfl_selection.py --settings hetero --seeds 0 --ablation flanc-dec"
  "$T1 --methods local lg_fedavg fedrolex pfedgate --settings hetero --seeds 0 --rounds 200"
  "$T1 --methods heterofl --settings hetero --seeds 0 --rounds 200 --set model=pa3dfl_cnn_fmnist_sbn --label sbn"
  "$T1 --methods flanc tailorfl --settings hetero --seeds 0 --rounds 200 --label rerun"
  "$T1 --methods ditto pfedhn lg_fedavg local flanc tailorfl pfedgate heterofl fedrolex --settings ideal --seeds 0 --rounds 200"
  "$T1 --methods fjord --settings hetero --seeds 1"
  "$T1 --methods fedavg --settings ideal --seeds 1"
  "$T1 --methods fjord --settings hetero --seeds 2"
  "$T1 --methods fedavg --settings ideal --seeds 2"
  "$T1 --methods fjord --settings ideal --seeds 1 2"
  "$T1 --methods pa3dfl fjord fedavg --settings hetero ideal --seeds 1 2"
  "$T1 --methods pa3dfl --settings hetero --seeds 2 --set algorithm_params.width_draw=upto --label upto"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.hn_lr=1.0 --label hnlr1"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.hn_step=plain --label hnplain"
  "$T1 --methods pa3dfl --settings ideal --seeds 0 --set algorithm_params.rank_p_min=clients --set algorithm_params.step_scale_max=1 --label clients-cap1"
  "$T1 --methods flanc --settings hetero --seeds 0"
  "$T1 --methods heterofl --settings hetero --seeds 0 --set model=pa3dfl_cnn_fmnist_sbn --label sbn"
)
# Attack lane: the 10,000-iteration IG attack on Pa3dFL's round-1 upload; IG on FedAvg's and
# Pa3dFL's round-50 uploads (a trained model); and again at round 1 with 2,000 iterations
# (session 51's table, whose JSON was lost with its machine: not in the committed record).
ATTACKS=(
  "$IG --methods pa3dfl --iterations 10000"
  "$IG --methods fedavg pa3dfl --iterations 2000 --round 50"
  "$IG --methods fedavg pa3dfl --iterations 2000"
)

stamp() { date -u +%FT%TZ; }

attack_lane() {
  local step rc
  for step in "${ATTACKS[@]}"; do
    echo "[$(stamp)] [attack] $step"
    bash -c "$step"
    rc=$?  # before $(stamp), whose own status would stand in for the step's
    echo "[$(stamp)] [attack] exit $rc ($step)"
  done
  echo "[$(stamp)] [attack] lane done"
}

# alive PID: whether the process PID still runs
alive() { kill -0 "$1" 2>/dev/null; }

# One training step, with WORKERS - 1 workers while the attack lane (PID $1) runs; when that
# lane ends mid-step, the step is stopped cleanly and started again with WORKERS.
train_step() {
  local lane=$1 step=$2 w cmd pid rc
  while true; do
    w=$WORKERS
    if alive "$lane" && ((WORKERS > 1)); then w=$((WORKERS - 1)); fi
    cmd=${step//\{W\}/$w}
    echo "[$(stamp)] [train] $cmd"
    bash -c "exec $cmd" &
    pid=$!
    while ((w < WORKERS)) && alive "$pid" && alive "$lane"; do sleep 10; done
    if ((w < WORKERS)) && alive "$pid"; then  # the attack lane ended: all workers now
      echo "[$(stamp)] [train] attack lane done: restarting with $WORKERS workers"
      kill -TERM "$pid"
      wait "$pid"
      continue
    fi
    wait "$pid"
    rc=$?
    echo "[$(stamp)] [train] exit $rc ($cmd)"
    return
  done
}

run_queue() {
  local step lane
  attack_lane &
  lane=$!
  for step in "${TRAIN[@]}"; do
    train_step "$lane" "$step"
  done
  echo "[$(stamp)] [train] lane done"
  wait "$lane"
  echo "[$(stamp)] queue done"
}

# Before any step: on a machine laid anew every step would fail at once, one after another.
# The scripts must start (their imports) and Fashion-MNIST must be there (installed by
# scripts/ensure-fmnist where it can, as `make data` does).
preflight() {
  local script
  for script in reproduce_pa3dfl_table1 pa3dfl_selection pa3dfl_leakage; do
    if ! "$PY" "benchmarks/$script.py" --help >/dev/null 2>&1; then
      echo "$PY cannot start benchmarks/$script.py: install first (make install-dev data)" >&2
      exit 2
    fi
  done
  bash scripts/ensure-fmnist || exit 2
}

# The queue's session yields to others (above); only when the queue leads it, so that a queue
# started from a shell does not renice that shell's session.
background() {
  local nice=${AUTOGROUP_NICE-10} stat
  [[ -n $nice && -w /proc/$$/autogroup ]] || return 0
  read -r -a stat <"/proc/$$/stat"  # field 6: the session id (no ps on a bare machine)
  [[ ${stat[5]} == "$$" ]] || return 0
  echo "$nice" >"/proc/$$/autogroup" 2>/dev/null || true
}

case "${1:-}" in
  "") background; preflight; run_queue ;;
  --list)
    printf 'train:  %s\n' "${TRAIN[@]//\{W\}/$WORKERS}"
    printf 'attack: %s\n' "${ATTACKS[@]}"
    ;;
  *) echo "usage: $0 [--list] (issue 24's remaining runs, in two lanes)" >&2; exit 2 ;;
esac
