#!/usr/bin/env bash
# lease-unpack.sh: turns the lease.tgz of one many-core lease (scripts/manycore-lease.sh)
# into a results directory to commit: each part's reports (latest.json, latest.md, ab.md,
# stdout.md), its logs, the profiles as text (`go tool pprof -top`, flat and -cum, and for
# CPU profiles the split by mwrpc package, benchmarks/cmd/mwrpcsplit; the profiles
# themselves and the charts stay out: they are binary), and a README.md that
# gathers what a reader looks for first (the parts' exits and times, the A/B table, the
# Goals sections with their verdicts) for its author to complete with the machine, the
# date and what the figures say.
#
#   scripts/lease-unpack.sh LEASE.tgz benchmarks/results/<date>-manycore-<commit>
#
# DEST must not exist. Needs Go (go tool pprof reads the profiles: they carry their
# symbols).
set -euo pipefail

die() { echo "lease-unpack: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: $0 LEASE.tgz DEST"
tgz=$1 dest=$2
[ -f "$tgz" ] || die "$tgz: no such file"
[ ! -e "$dest" ] || die "$dest exists: name a new directory"
command -v go >/dev/null || die "go is not on PATH (go tool pprof reads the profiles)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$tgz" -C "$tmp"
split=$tmp/.mwrpcsplit
(cd "$(dirname "${BASH_SOURCE[0]}")/../benchmarks" && go build -o "$split" ./cmd/mwrpcsplit) ||
	die "cannot build benchmarks/cmd/mwrpcsplit"
mkdir -p "$dest"

# The text a part wrote, where it wrote it.
(cd "$tmp" && find . -type f \( -name '*.json' -o -name '*.md' -o -name '*.txt' -o -name '*.log' \) | sort) |
	while read -r f; do
		mkdir -p "$dest/$(dirname "$f")"
		cp "$tmp/$f" "$dest/$f"
	done

# Each profile as text reports beside where it was: NAME-top.txt and NAME-cum.txt, and for
# a CPU profile NAME-split.md.
(cd "$tmp" && find . -type f -name '*.pprof' | sort) |
	while read -r p; do
		out=$dest/${p%.pprof}
		mkdir -p "$(dirname "$out")"
		go tool pprof -top -nodecount=40 "$tmp/$p" >"$out-top.txt" 2>/dev/null || echo "lease-unpack: $p: pprof failed" >&2
		go tool pprof -top -cum -nodecount=40 "$tmp/$p" >"$out-cum.txt" 2>/dev/null || true
		case $p in
		*.mutex.pprof | *.block.pprof) ;;
		*) (cd "$tmp" && "$split" "$p") >"$out-split.md" || echo "lease-unpack: $p: mwrpcsplit failed" >&2 ;;
		esac
	done

# section FILE TITLE: FILE's lines from the heading TITLE to the next heading of its level.
section() {
	awk -v t="$2" '$0 == t { on = 1; print; next } on && /^## / { exit } on { print }' "$1"
}

{
	echo "# 16 cores, DATE: COMMIT against BASE"
	echo
	echo "To complete: the machine (lscpu of the lease), the date, and what the figures say."
	echo "Made by scripts/lease-unpack.sh from the lease's lease.tgz."
	echo
	if [ -f "$dest/parts.txt" ]; then
		echo "## The parts"
		echo
		sed 's/^/    /' "$dest/parts.txt"
		echo
	fi
	if [ -f "$dest/ab/ab.md" ]; then
		echo "## [ab/](ab/ab.md): this tree against the base, alternating"
		echo
		grep -E '^- (Base|New|Machine)' "$dest/ab/ab.md" || true
		echo
		grep -E '^\|' "$dest/ab/ab.md" || true
		echo
	fi
	for part in main stream lanes; do
		md=$dest/$part/latest.md
		[ -f "$md" ] || continue
		echo "## [$part/]($part/latest.md)"
		echo
		grep -E '^- (Machine|Command):' "$md" || true
		if grep -q '^## Goals$' "$md"; then
			echo
			section "$md" "## Goals" | sed '1d'
		fi
		echo
	done
	if [ -d "$dest/profiles" ]; then
		echo "## [profiles/](profiles/)"
		echo
		echo "Each run's CPU, mutex and block profiles of both processes as text (NAME-top.txt, NAME-cum.txt; NAME-split.md, a CPU profile by mwrpc package):"
		echo
		(cd "$dest/profiles" && find . -mindepth 1 -maxdepth 1 -type d | sort | sed 's|^\./|- |')
	fi
} >"$dest/README.md"

echo "lease-unpack: $dest: $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1); complete $dest/README.md"
