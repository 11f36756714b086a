package bench

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where a run happened. It appears once in latest.json.
type Machine struct {
	CPUModel   string `json:"cpu_model"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	Kernel     string `json:"kernel,omitempty"`
	Date       string `json:"date"` // RFC 3339, when the run started
}

// ThisMachine describes the machine this process runs on.
func ThisMachine(start time.Time) Machine {
	m := Machine{
		CPUModel:   cpuModel(),
		NumCPU:     runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion:  runtime.Version(),
		OS:         runtime.GOOS,
		Arch:       runtime.GOARCH,
		Date:       start.UTC().Format(time.RFC3339),
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// cpuModel is the first "model name" of /proc/cpuinfo, or "unknown".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "unknown"
}

// SourceEnv, where set, is what Source reports: the tree a harness built elsewhere was
// built from (scripts/manycore.sh sets it from the BUILD file make manycore-build writes),
// since the git of the directory it runs in may say another commit, or nothing.
const SourceEnv = "MWRPCBENCH_SOURCE"

// Source describes the mwrpc tree the harness was built from (through the replace
// directive: the working tree, not a release): the commit, and "with uncommitted
// changes" when tracked files outside benchmarks/ differ from it. Empty without git.
func Source() string {
	if s := os.Getenv(SourceEnv); s != "" {
		return s
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return ""
	}
	dir := strings.TrimSpace(string(top))
	commit, err := exec.Command("git", "-C", dir, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	s := "commit " + strings.TrimSpace(string(commit))
	dirty, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks").Output()
	if err == nil && len(strings.TrimSpace(string(dirty))) > 0 {
		s += " with uncommitted changes"
	}
	return s
}

// LoadAvg returns the 1-minute load average, or 0 where /proc/loadavg cannot be read.
func LoadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}
