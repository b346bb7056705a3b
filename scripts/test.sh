#!/usr/bin/env bash
# make test: runs every stage, each as its own make target, even when one
# fails, then prints a table of each stage's result, test counts and time.
# The last line, "make test: N passed, N failed" (stages), is what CI reads
# beside the exit code, which is 1 when any stage failed. Each stage's whole
# output is kept in bin/test-logs/STAGE.log (TEST_LOGS moves it).
set -uo pipefail
cd "$(dirname "$0")/.."

MAKE=${MAKE:-make}
stages=(build:build lint:lint go:test-go python:test-python vllm:test-vllm deploy:test-deploy)
logs=${TEST_LOGS:-bin/test-logs}
mkdir -p "$logs"

# count WORD LOG: the number before WORD on the stage's last summary line
# (testreport's "N passed, N failed, N skipped" or pytest's "= N passed,
# N skipped in 12.3s =").
count() {
	local line
	line=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped)' "$2" | tail -n 1)
	grep -oE "[0-9]+ $1" <<<"$line" | head -n 1 | cut -d' ' -f1
}

clock() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

rows=()
ok=0
bad=0
start_all=$SECONDS
for s in "${stages[@]}"; do
	name=${s%%:*} target=${s#*:}
	log=$logs/$name.log
	printf '\n=== make test: stage %s (make %s) ===\n' "$name" "$target"
	t0=$SECONDS
	"$MAKE" --no-print-directory "$target" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	took=$((SECONDS - t0))
	if [ "$rc" = 0 ]; then
		result=ok ok=$((ok + 1))
	else
		result="FAIL ($rc)" bad=$((bad + 1))
	fi
	passed=$(count passed "$log") failed=$(count failed "$log") skipped=$(count skipped "$log")
	errors=$(count error "$log")
	[ -n "$errors" ] && failed=$((${failed:-0} + errors))
	# pytest leaves out the kinds it has none of.
	if [ -n "$passed$failed$skipped" ]; then
		passed=${passed:-0} failed=${failed:-0} skipped=${skipped:-0}
	fi
	rows+=("$(printf '%-8s %-9s %7s %7s %8s %8s' "$name" "$result" "${passed:--}" "${failed:--}" "${skipped:--}" "$(clock "$took")")")
done

printf '\n%-8s %-9s %7s %7s %8s %8s\n' stage result passed failed skipped time
printf '%s\n' "${rows[@]}"
printf '%-8s %-9s %7s %7s %8s %8s\n' all "" "" "" "" "$(clock $((SECONDS - start_all)))"
[ "$bad" = 0 ] || echo "logs: $logs/STAGE.log"
echo "make test: $ok passed, $bad failed"
[ "$bad" = 0 ]
