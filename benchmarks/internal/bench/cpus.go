package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ServeCPUsEnv carries a -cpus split's server CPU list (as "0-7") from the harness to the
// server processes it starts: each pins itself to it (ServeMain's caller, PinServer).
const ServeCPUsEnv = "MWRPCBENCH_SERVE_CPUS"

// CPUSplit is a -cpus value: the CPUs the server processes run on and those the harness
// (the clients) runs on, disjoint, so that one many-core machine behaves like two hosts.
type CPUSplit struct {
	Server, Client []int
}

// String formats the split as -cpus takes it: "0-7/8-15".
func (s CPUSplit) String() string { return FormatCPUList(s.Server) + "/" + FormatCPUList(s.Client) }

// ParseCPUSplit reads "SERVER/CLIENT", each a CPU list as taskset -c takes it ("0-7",
// "0,2,4-6"); the two must not share a CPU.
func ParseCPUSplit(s string) (CPUSplit, error) {
	srv, cli, ok := strings.Cut(s, "/")
	if !ok {
		return CPUSplit{}, fmt.Errorf("cpu split %q: want SERVER/CLIENT, as 0-7/8-15", s)
	}
	var sp CPUSplit
	var err error
	if sp.Server, err = ParseCPUList(srv); err != nil {
		return CPUSplit{}, fmt.Errorf("server CPUs: %w", err)
	}
	if sp.Client, err = ParseCPUList(cli); err != nil {
		return CPUSplit{}, fmt.Errorf("client CPUs: %w", err)
	}
	for _, c := range sp.Server {
		if slices.Contains(sp.Client, c) {
			return CPUSplit{}, fmt.Errorf("cpu split %q: CPU %d is on both sides", s, c)
		}
	}
	return sp, nil
}

// maxCPU bounds a CPU number (the kernel's CPU_SETSIZE is 1024).
const maxCPU = 1023

// ParseCPUList reads a CPU list as taskset -c takes it: numbers and ranges separated by
// commas ("0-3,8,10-11"). The result is sorted, without duplicates, and not empty.
func ParseCPUList(s string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b > maxCPU {
			return nil, fmt.Errorf("cpu list %q: bad entry %q (want N or N-M, 0 to %d)", s, part, maxCPU)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// FormatCPUList writes cpus (sorted) the way ParseCPUList reads them, ranges joined.
func FormatCPUList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		} else {
			parts = append(parts, strconv.Itoa(cpus[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
