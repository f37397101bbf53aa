#!/usr/bin/env bash
# Multi-process ddp through the real binary, two ranks on loopback (Gloo):
#   - launch: 2 ranks = 1 process with the global batch (test loss within 1e-5), overlapped and
#     after-backward reduction agree, only rank 0 prints, --resume works on every rank;
#   - faults: a killed rank or a hung one makes the other exit non-zero with a clear error before
#     --dist-timeout ends (killed) or right after it (hung); launch stops the survivors;
#   - SIGTERM to launch and the ranks at once, or to one rank alone: one checkpoint, exit 143;
#   - a resumed epoch reports the uninterrupted run's metrics; another world size is refused
#     mid-epoch; ranks started with other settings stop at start-up with exit 2;
#   - bad environments are clear errors.
# Every wait is bounded; children still running at exit are killed.
set -u
bin=$1
tmp=$(mktemp -d)
# Not a list of pids: most have ended and been reaped by then, and with pid_max 32768 a ctest run
# recycles pids, so killing a remembered pid could hit an unrelated process. Children of this
# shell are ours for sure (launch's ranks die with their launcher: PR_SET_PDEATHSIG).
cleanup() { pkill -9 -P $$ 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0 passes=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { passes=$((passes + 1)); }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
json_get() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval("d"+sys.argv[2]))' "$1" "$2"; }
# Seconds since $1 (date +%s.%N), as a float.
since() { python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),2))" "$1"; }
# Waits up to $2 seconds for the background job $1 to end; sets rc to its exit code (or "running").
wait_for() {
  local pid=$1 limit=$2 t=0
  while kill -0 "$pid" 2>/dev/null && [ "$t" -lt $((limit * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  if kill -0 "$pid" 2>/dev/null; then rc=running; else wait "$pid"; rc=$?; fi
}
# Gloo is the only CPU backend: a LibTorch without its headers (a pip torch) cannot run any of this.
devices=$("$bin" devices)
if ! grep -qE "distributed \(c10d\) backends:.*\bgloo\b" <<<"$devices"; then
  echo "skipped: this build has no Gloo backend (pip torch ships no gloo headers)"
  exit 77
fi
cuda_build=no
grep -q "built with CUDA: yes" <<<"$devices" && cuda_build=yes
# --device cpu: on a machine with a GPU, auto would put every rank on cuda:RANK.
common=(--device cpu --dataset dummy --model simplenn --threads 1 --blas-threads 1 --seed 3)

# --- 2 ranks vs 1 process over the same global batch --------------------------------------------
single=$("$bin" train "${common[@]}" --epochs 2 --batch-size 64 --json 2>"$tmp/single.err")
ddp=$("$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 2 --batch-size 32 --json 2>"$tmp/ddp.err")
rc=$?
if [ $rc -ne 0 ]; then fail "launch 2 ranks exited $rc: $(tail -5 "$tmp/ddp.err")"; else
  a=$(json_get "$single" '["test"]["loss"]'); b=$(json_get "$ddp" '["test"]["loss"]')
  if python3 -c "import sys; sys.exit(0 if abs($a-$b) < 1e-5 else 1)"; then pass; else
    fail "2 ranks x batch 32 test loss $b != 1 process x batch 64 test loss $a"; fi
  [ "$(json_get "$ddp" '["epochs"][1]["loss"] > 0')" = True ] && pass || fail "no epoch loss in $ddp"
  grep -q "ddp, rank 0 of 2, gloo" <<<"$(json_get "$ddp" '["settings"]["strategy"]')" && pass ||
    fail "strategy row: $(json_get "$ddp" '["settings"]')"
  [ "$(json_get "$ddp" '["settings"]["batch"]')" = "32 per rank, 64 a step over 2 ranks" ] && pass ||
    fail "batch row: $(json_get "$ddp" '["settings"]["batch"]')"
  [ "$(grep -c "^Epoch 2/2" "$tmp/ddp.err")" = 1 ] && pass || fail "only rank 0 should print: $(cat "$tmp/ddp.err")"
fi
no_overlap=$("$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 2 --batch-size 32 --step autograd --no-overlap --json 2>/dev/null)
overlap=$("$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 2 --batch-size 32 --step autograd --json 2>/dev/null)
if [ -n "$overlap" ] && [ "$(json_get "$overlap" '["test"]["loss"]')" = "$(json_get "$no_overlap" '["test"]["loss"]')" ]; then pass; else
  fail "overlap / no-overlap differ: $overlap vs $no_overlap"; fi
# --micro-batches: each rank's backward runs once per chunk, so the buckets are all-reduced after
# the last one (an overlapped bucket would go out with the first chunk's gradients only).
micro=$("$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 2 --batch-size 32 --step autograd --micro-batches 4 --json 2>"$tmp/micro.err")
if [ -n "$micro" ] && python3 -c "import sys; sys.exit(0 if abs($(json_get "$micro" '["test"]["loss"]')-$(json_get "$no_overlap" '["test"]["loss"]')) < 1e-5 else 1)"; then pass; else
  fail "micro-batches vs whole batches under ddp: $micro vs $no_overlap $(tail -3 "$tmp/micro.err")"; fi
[ -n "$micro" ] && grep -q "after backward (the last micro-batch's)" <<<"$(json_get "$micro" '["settings"]["strategy"]')" && pass ||
  fail "strategy row with micro-batches: $micro"

# Real torchrun (Debian's python3-torch), --no-python: its agent hosts the TCPStore itself, so the
# ranks must join it as clients. Debian's torchrun 1.13 crashes on Python 3.11 with its default
# output settings (Std.from_str returns None), hence the explicit -r/-t maps (stdout to a file,
# teed to ours with a "[default0]:" prefix).
if command -v torchrun >/dev/null; then
  torchrun_out=$(timeout 120 torchrun --nproc_per_node 2 --master_port "$(free_port)" --no_python \
    -r 0:1,1:1 -t 0:1,1:1 "$bin" train "${common[@]}" --epochs 2 --batch-size 32 --json 2>"$tmp/torchrun.err" |
    sed -n 's/^\[default0\]://p')
  if [ -n "$torchrun_out" ] && [ -n "$single" ] &&
    python3 -c "import sys; sys.exit(0 if abs($(json_get "$single" '["test"]["loss"]')-$(json_get "$torchrun_out" '["test"]["loss"]')) < 1e-5 else 1)"; then
    pass
  else
    fail "torchrun --nproc_per_node 2 --no_python: $(grep -v '^ *$' "$tmp/torchrun.err" | grep -iE "error|failed" | head -5)"
  fi
  # An elastic restart: rank 1 fails attempt 0 at once, torchrun restarts both ranks
  # (TORCHELASTIC_RESTART_COUNT=1), and the second attempt trains what one process trains.
  printf '#!/bin/sh\nif [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then echo "rank 1 fails attempt 0" >&2; exit 3; fi\nexec "$@"\n' >"$tmp/fail_once.sh"
  chmod +x "$tmp/fail_once.sh"
  restarted=$(timeout 120 torchrun --nproc_per_node 2 --max_restarts 1 --monitor_interval 1 --master_port "$(free_port)" \
    --no_python -r 0:1,1:1 -t 0:1,1:1 "$tmp/fail_once.sh" "$bin" train "${common[@]}" --epochs 2 --batch-size 32 --json \
    2>"$tmp/restart.err" | sed -n 's/^\[default0\]://p')
  if [ -n "$restarted" ] && grep -q "rank 1 fails attempt 0" "$tmp/restart.err" &&
    [ "$(json_get "$restarted" '["test"]["loss"]')" = "$(json_get "$torchrun_out" '["test"]["loss"]')" ]; then pass; else
    fail "torchrun --max_restarts 1 after a failed attempt: $(grep -iE "error|fail" "$tmp/restart.err" | head -5)"; fi
else
  echo "skipped the torchrun checks: no torchrun on PATH"
fi

# --resume on every rank: 1 epoch saved by rank 0, resumed by both = 2 epochs in one go.
"$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 1 --batch-size 32 --save "$tmp/e1.pt" >/dev/null 2>&1
resumed=$("$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 2 --batch-size 32 --resume "$tmp/e1.pt" --json 2>/dev/null)
if [ -n "$resumed" ] && [ -n "$single" ] &&
   python3 -c "import sys; sys.exit(0 if abs($(json_get "$resumed" '["test"]["loss"]') - $(json_get "$single" '["test"]["loss"]')) < 1e-5 else 1)"; then pass; else
  fail "2 ranks resumed after epoch 1 differ from 2 epochs in one run: $resumed"; fi

# --- a rank that dies, a rank that hangs ---------------------------------------------------------
# A --verbose log line of a training step ("  epoch 1 step 20/..."; the settings table's "step" row
# comes before training starts).
training='epoch [0-9]+ step [0-9]+/'
# start_pair TIMEOUT: two ranks training for a long time; sets r0 and r1 (pids).
start_pair() {
  local port; port=$(free_port)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$bin" train "${common[@]}" \
      --epochs 100000 --batch-size 8 --dist-timeout "$1" --verbose --log-every 20 >"$tmp/r$r.log" 2>&1 &
    eval "r$r=$!"
  done
  local t=0
  while ! grep -qsE "$training" "$tmp/r0.log" && [ $t -lt 300 ]; do sleep 0.1; t=$((t + 1)); done
  grep -qsE "$training" "$tmp/r0.log" || fail "ranks did not start training: $(tail -5 "$tmp/r0.log")"
}
start_pair 30
kill -9 "$r1"; t0=$(date +%s.%N)
wait_for "$r0" 40; took=$(since "$t0")
if [ "$rc" = 2 ] && grep -q "rank 0: .* failed" "$tmp/r0.log" && ! grep -q "frame #" "$tmp/r0.log" &&
   python3 -c "import sys; sys.exit(0 if $took < 30 else 1)"; then pass; else
  fail "killed rank 1: rank 0 exit $rc after ${took}s (timeout 30): $(tail -3 "$tmp/r0.log")"; fi

start_pair 3
kill -STOP "$r1"; t0=$(date +%s.%N)
wait_for "$r0" 30; took=$(since "$t0")
kill -9 "$r1"
if [ "$rc" = 2 ] && grep -q "rank 0: .* failed" "$tmp/r0.log" && python3 -c "import sys; sys.exit(0 if $took < 20 else 1)"; then pass; else
  fail "hung rank 1: rank 0 exit $rc after ${took}s (timeout 3): $(tail -3 "$tmp/r0.log")"; fi

# launch: one rank killed -> launch exits non-zero, the other rank is stopped.
"$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 100000 --batch-size 8 --dist-timeout 30 >"$tmp/l.log" 2>&1 &
launcher=$!
t=0; children=""
while [ $t -lt 100 ]; do children=$(pgrep -P "$launcher" | tr '\n' ' '); [ "$(wc -w <<<"$children")" = 2 ] && break; sleep 0.1; t=$((t + 1)); done
sleep 2
victim=$(cut -d' ' -f2 <<<"$children"); survivor=$(cut -d' ' -f1 <<<"$children")
kill -9 "$victim"
wait_for "$launcher" 20
if [ "$rc" != 0 ] && [ "$rc" != running ] && ! kill -0 "$survivor" 2>/dev/null && grep -q "rank 1 was killed by signal 9" "$tmp/l.log"; then pass; else
  fail "launch with a killed rank: exit $rc, survivor alive: $(kill -0 "$survivor" 2>/dev/null && echo yes), log: $(tail -3 "$tmp/l.log")"; fi

# launch: SIGTERM to the launcher is passed on once; the ranks agree on a step to stop at, rank 0
# checkpoints, and all exit 143 long before --dist-timeout (a rank stopping alone would leave the
# other waiting in a collective until the timeout).
# The signal goes once rank 0 logs a step: a fixed sleep sent it, under ASan on a loaded CI machine,
# while the ranks were still loading, where SIGTERM simply ends them and nothing is saved.
"$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 100000 --batch-size 8 --dist-timeout 30 \
  --verbose --log-every 20 --save "$tmp/sig.pt" >"$tmp/s.log" 2>&1 &
launcher=$!
t=0; children=""
while [ $t -lt 100 ]; do children=$(pgrep -P "$launcher" | tr '\n' ' '); [ "$(wc -w <<<"$children")" = 2 ] && break; sleep 0.1; t=$((t + 1)); done
t=0
while ! grep -qsE "$training" "$tmp/s.log" && [ $t -lt 600 ]; do sleep 0.1; t=$((t + 1)); done
grep -qsE "$training" "$tmp/s.log" || fail "launched ranks did not start training in 60 s: $(tail -5 "$tmp/s.log")"
kill -TERM "$launcher"; t0=$(date +%s.%N)
wait_for "$launcher" 25; took=$(since "$t0")
ckpt=$(sed -n 's/.*checkpoint saved: \(.*\)$/\1/p' "$tmp/s.log" | head -1)
alive=""; for c in $children; do kill -0 "$c" 2>/dev/null && alive="$alive $c"; done
if [ "$rc" = 143 ] && [ -n "$ckpt" ] && [ -f "$ckpt" ] && [ -z "$alive" ] && grep -q "resume with: " "$tmp/s.log" &&
   python3 -c "import sys; sys.exit(0 if $took < 15 else 1)"; then pass; else
  fail "SIGTERM to launch: exit $rc after ${took}s, checkpoint '$ckpt', ranks alive:$alive, log: $(tail -5 "$tmp/s.log")"; fi
[ "$(grep -c "checkpoint saved" "$tmp/s.log")" = 1 ] && pass || fail "only rank 0 should report the interrupt: $(cat "$tmp/s.log")"
# Its resume command starts the ranks again (a rank's own command line would be one process, which
# refuses --dist-timeout).
grep -qE "resume with: \S+ launch --nproc-per-node 2 -- train .*--dist-timeout 30 .*--resume " "$tmp/s.log" && pass ||
  fail "the resume command of a launched run should run under launch: $(grep "resume with" "$tmp/s.log")"
if [ -n "$ckpt" ] && [ -f "$ckpt" ]; then
  "$bin" eval --checkpoint "$ckpt" >/dev/null 2>&1 && pass || fail "interrupt checkpoint $ckpt does not evaluate"
fi

# --- bad environments --------------------------------------------------------------------------
expect_error() {  # expect_error PATTERN ENV... -- ARGS...
  local pattern=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local out rc
  out=$(env "${envs[@]}" "$bin" "$@" 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -qE -- "$pattern" <<<"$out" && ! grep -q "frame #" <<<"$out"; then pass; else
    fail "env ${envs[*]} spritetorch $*: exit $rc, wanted 2 and /$pattern/: $(head -3 <<<"$out")"; fi
}
port=$(free_port)
expect_error "RANK=2 is not below WORLD_SIZE=2" RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- train "${common[@]}"
expect_error "needs the environment variables MASTER_ADDR, MASTER_PORT" RANK=0 WORLD_SIZE=2 -- train "${common[@]}"
expect_error "needs the environment variables RANK, WORLD_SIZE" X=1 -- train "${common[@]}" --strategy ddp
t0=$(date +%s.%N)
expect_error "rendezvous at 127.0.0.1:$port failed" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port -- train "${common[@]}" --dist-timeout 2
python3 -c "import sys; sys.exit(0 if $(since "$t0") < 10 else 1)" && pass || fail "unreachable master took over 10 s with --dist-timeout 2"
# A rank still waiting in the rendezvous (its peer never came) ends at the first SIGTERM, as
# launchers expect (torchrun waits 30 s before SIGKILL), instead of sitting out --dist-timeout.
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) "$bin" train "${common[@]}" --dist-timeout 120 >"$tmp/lone.log" 2>&1 &
lone=$!
sleep 2
kill -TERM "$lone"
wait_for "$lone" 10
[ "$rc" = 143 ] && pass || fail "SIGTERM to a rank in the rendezvous: $rc after 10 s (wanted 143 at once): $(tail -3 "$tmp/lone.log")"
# Under torchrun rank 0 joins the agent's store too: a missing agent is named as such.
expect_error "hint: torchrun's agent hosts the store" RANK=0 WORLD_SIZE=2 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_USE_AGENT_STORE=True -- train "${common[@]}" --dist-timeout 2
if [ "$cuda_build" = no ]; then
  expect_error "needs a CUDA build" X=1 -- train "${common[@]}" --strategy dp
  expect_error "nccl" X=1 -- launch --nproc-per-node 1 -- train "${common[@]}" --dist-backend nccl
fi

# --- signals to the ranks themselves -------------------------------------------------------------
# start_launch LOG: 2 long-running launched ranks; once rank 0 logs a training step, sets launcher,
# rank0 and rank1 (pids; each rank's RANK read from its environment).
start_launch() {
  "$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 100000 --batch-size 8 --dist-timeout 30 \
    --verbose --log-every 20 --save "$tmp/$1.pt" >"$tmp/$1.log" 2>&1 &
  launcher=$!
  local t=0
  while ! grep -qsE "$training" "$tmp/$1.log" && [ $t -lt 600 ]; do sleep 0.1; t=$((t + 1)); done
  rank0="" rank1=""
  for c in $(pgrep -P "$launcher"); do
    case $(tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | sed -n 's/^RANK=//p') in
      0) rank0=$c ;; 1) rank1=$c ;;
    esac
  done
  [ -n "$rank0" ] && [ -n "$rank1" ] || fail "$1: launched ranks did not start training in 60 s: $(tail -5 "$tmp/$1.log")"
}
# expect_stopped NAME: the launch of start_launch NAME, signalled, ends with 143, one checkpoint
# (rank 0's), its resume command, no rank blamed and none left running.
expect_stopped() {
  wait_for "$launcher" 25
  local ckpt; ckpt=$(sed -n 's/.*checkpoint saved: \(.*\)$/\1/p' "$tmp/$1.log" | head -1)
  if [ "$rc" = 143 ] && [ -n "$ckpt" ] && [ -f "$ckpt" ] && grep -q "resume with: .* launch --nproc-per-node 2 -- train" "$tmp/$1.log" &&
     [ "$(grep -c "checkpoint saved" "$tmp/$1.log")" = 1 ] && ! grep -q "stopping the other ranks" "$tmp/$1.log" &&
     ! kill -0 "$rank0" 2>/dev/null && ! kill -0 "$rank1" 2>/dev/null; then pass; else
    fail "$1: exit $rc, checkpoint '$ckpt', log: $(tail -6 "$tmp/$1.log")"; fi
}
# SIGTERM to launch and both ranks at once (pkill, killall, a Slurm preemption): each rank also gets
# launch's forwarded copy, which must not count as a second signal. Twice: the copies race.
for try in 1 2; do
  start_launch "all$try"
  kill -TERM "$launcher" "$rank0" "$rank1"
  expect_stopped "all$try"
done
# SIGTERM to one rank alone: the ranks agree to stop at the same step; the first one's exit 143 is
# not a failure, so launch leaves rank 0 to write the checkpoint and print the resume command.
for r in 0 1; do
  start_launch "one$r"
  eval "kill -TERM \"\$rank$r\""
  expect_stopped "one$r"
done

# --- the running metrics of a resumed epoch ---------------------------------------------------------
# A mid-epoch checkpoint records the sums over all ranks (rank 0 carries them on after resuming, the
# others start at zero): the resumed epochs report what the uninterrupted run reported.
# Periodic and interrupt checkpoints are written by the same code at an agreed step; periodic ones
# land on a known step. 4096 samples / (2 x 32) = 64 steps per epoch: step 50 is inside epoch 1,
# step 100 inside epoch 2. Accuracy is a count, so it must match to the bit; the float32 loss sums
# add in another order after the resume, hence 1e-5 for the loss.
straight=$("$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 2 --batch-size 32 --checkpoint-every 50 \
  --save "$tmp/p.pt" --json 2>"$tmp/p.err")
for step in 50 100; do
  resumed=$("$bin" launch --nproc-per-node 2 -- train "${common[@]}" --epochs 2 --batch-size 32 --checkpoint-every 50 \
    --resume "$tmp/p.step$step.pt" --save "$tmp/p$step.pt" --json 2>"$tmp/p$step.err")
  if [ -n "$straight" ] && [ -n "$resumed" ] && python3 - "$straight" "$resumed" <<'PY'; then pass; else
import json, sys
full = {e["epoch"]: e for e in json.loads(sys.argv[1])["epochs"]}
resumed = json.loads(sys.argv[2])["epochs"]
ok = len(resumed) > 0
for e in resumed:
    f = full[e["epoch"]]
    same = abs(e["loss"] - f["loss"]) <= 1e-5 * max(1.0, abs(f["loss"])) and e["accuracy"] == f["accuracy"]
    if not same:
        print("epoch %d: resumed loss %r accuracy %r, uninterrupted %r %r" % (
            e["epoch"], e["loss"], e["accuracy"], f["loss"], f["accuracy"]))
    ok = ok and same
sys.exit(0 if ok else 1)
PY
    fail "2 ranks resumed from step $step report other epoch metrics than the uninterrupted run: $(tail -3 "$tmp/p$step.err")"
  fi
done
# A mid-epoch checkpoint resumes only with the world size that wrote it (a step takes world x batch
# samples); at an epoch's end any world size may go on.
expect_error "stopped inside epoch 1 \(step 50\) of a run of 2 ranks; this run has one process" X=1 -- \
  train "${common[@]}" --epochs 2 --batch-size 32 --resume "$tmp/p.step50.pt" --save "$tmp/w1.pt"
"$bin" train "${common[@]}" --epochs 1 --batch-size 64 --checkpoint-every 20 --save "$tmp/s1.pt" >/dev/null 2>&1
expect_error "stopped inside epoch 1 \(step 20\) of a run of one process; this run has 2 ranks" X=1 -- \
  launch --nproc-per-node 2 -- train "${common[@]}" --epochs 1 --batch-size 32 --resume "$tmp/s1.step20.pt" --save "$tmp/w2.pt"
"$bin" train "${common[@]}" --epochs 2 --batch-size 64 --resume "$tmp/e1.pt" --save "$tmp/w3.pt" >/dev/null 2>&1 && pass ||
  fail "a 2-rank checkpoint at an epoch's end should resume as one process"

# --- ranks started with other settings ----------------------------------------------------------------
# mismatched_pair NAME RANK0-FLAGS -- RANK1-FLAGS: both ranks stop at start-up with exit 2 naming
# the setting, instead of a Gloo abort, a wait for --dist-timeout or a run trained apart.
mismatched_pair() {
  local name=$1; shift
  local flags0=(); while [ "$1" != "--" ]; do flags0+=("$1"); shift; done; shift
  local port; port=$(free_port)
  local base=(--device cpu --threads 1 --blas-threads 1 --seed 3)
  [[ " ${flags0[*]} " == *" --dataset "* ]] || base+=(--dataset dummy)
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$bin" train "${base[@]}" \
    --dist-timeout 60 "$@" >"$tmp/m1.log" 2>&1 &
  local other=$!
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 "$bin" train "${base[@]}" \
    --dist-timeout 60 "${flags0[@]}" >"$tmp/m0.log" 2>&1
  local rc0=$?
  wait_for "$other" 30
  if [ "$rc0" = 2 ] && [ "$rc" = 2 ] && grep -q "rank(s) 1 differ from rank 0 (first $name" "$tmp/m0.log" &&
     grep -q "^error: rank 1: .*($name .* here, .* on rank 0" "$tmp/m1.log" && grep -q "^hint: every rank must run the same" "$tmp/m1.log" &&
     ! grep -q "terminate called" "$tmp/m0.log" "$tmp/m1.log"; then pass; else
    fail "ranks differing in $name: exits $rc0 and $rc: $(tail -2 "$tmp/m0.log") / $(tail -2 "$tmp/m1.log")"; fi
}
one=(--model simplenn --epochs 1)
mismatched_pair --batch-size "${one[@]}" --batch-size 32 -- "${one[@]}" --batch-size 16
mismatched_pair --model --model simplenn --epochs 1 -- --model ann --epochs 1
mismatched_pair --epochs --model simplenn --epochs 2 -- --model simplenn --epochs 1
mismatched_pair --lr "${one[@]}" --lr 0.001 -- "${one[@]}" --lr 0.002
# Data of the same size that differs (procedural sprites of another --data-seed: a folder read at another
# --size, or other files under the same name, alike) would train each rank on its own set.
sprites=(--model cnn --epochs 1 --dataset sprites --sprite-count 64)
mismatched_pair "training data" "${sprites[@]}" --data-seed 1 -- "${sprites[@]}" --data-seed 2
generator=(--task generate --unet-base 8 --epochs 1 --dataset sprites --sprite-count 64 --batch-size 16)
mismatched_pair --prediction "${generator[@]}" --prediction v -- "${generator[@]}" --prediction eps
# The same setting written two ways (adam's weight decay left out, and given as its default 0) is
# the same run: both ranks train.
port=$(free_port)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$bin" train --device cpu --dataset dummy \
  --threads 1 --blas-threads 1 --dist-timeout 60 "${one[@]}" --no-run-dir >"$tmp/wd1.log" 2>&1 &
other=$!
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 "$bin" train --device cpu \
  --dataset dummy --threads 1 --blas-threads 1 --dist-timeout 60 "${one[@]}" --weight-decay 0 \
  --no-run-dir >"$tmp/wd0.log" 2>&1
rc0=$?
wait_for "$other" 30
[ "$rc0" = 0 ] && [ "$rc" = 0 ] && pass ||
  fail "--weight-decay 0 beside adam's default: exits $rc0 and $rc: $(tail -2 "$tmp/wd0.log") / $(tail -2 "$tmp/wd1.log")"

# launch inside a torchrun worker: the agent's store variables are not the ranks' to follow.
TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 timeout 120 "$bin" launch --nproc-per-node 2 -- \
  train "${common[@]}" --epochs 1 --batch-size 32 --dist-timeout 20 >"$tmp/te.log" 2>&1
rc=$?
[ "$rc" = 0 ] && pass || fail "launch with TORCHELASTIC_USE_AGENT_STORE inherited: exit $rc: $(tail -3 "$tmp/te.log")"

echo "multiproc: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
