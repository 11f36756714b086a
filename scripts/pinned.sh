# pinned.sh: what the many-core scripts (manycore.sh, manycore-ab.sh, manycore-lease.sh)
# share, sourced by them: the harness run as two hosts would see it.

# cpu_count LIST: the CPUs a taskset list such as 0-7 or 0,2,4-5 names.
cpu_count() { tr ',' '\n' <<<"$1" | awk -F- '{ n += (NF == 2 ? $2 - $1 + 1 : 1) } END { print n }'; }

# run_pinned SECONDS BIN FLAGS...: BIN (an mwrpcbench) on CLIENT_CPUS, GOMAXPROCS their
# count, its server processes on SERVER_CPUS (-cpus), a system that fails in a cell leaving
# that cell (-keep-going); interrupted at SECONDS (exit 124), killed 20 s later.
run_pinned() {
	local secs=$1 bin=$2
	shift 2
	GOMAXPROCS=$(cpu_count "$CLIENT_CPUS") timeout --signal=INT --kill-after=20 "$secs" \
		taskset -c "$CLIENT_CPUS" "$bin" -cpus "$SERVER_CPUS/$CLIENT_CPUS" -keep-going "$@"
}
