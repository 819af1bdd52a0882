package bench

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// processStat reads what /proc/PID/status says: a child's command name,
// and a resident set that grows with what the child touches; processCPU
// reads the same file's CPU times.
func TestProcessStatAgreesWithStatus(t *testing.T) {
	// dd touches its 64 MiB buffer as it copies.
	cmd := exec.Command("dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1000000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var comm string
	var rss, status int64
	for range 500 {
		comm, rss = processStat(cmd.Process.Pid)
		status = vmRSS(t, cmd.Process.Pid)
		if rss > 64<<20 && status > 64<<20 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if comm != "dd" {
		t.Errorf("command name %q, want dd", comm)
	}
	if rss < 64<<20 || rss < status*9/10 || rss > status*11/10 {
		t.Errorf("resident set %d bytes; /proc status says %d, and the buffer is 64 MiB", rss, status)
	}
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
	}
	if cpu, ok := processCPU(os.Getpid()); !ok || cpu < 50*time.Millisecond {
		t.Errorf("this process's CPU: %v (%v) after 100 ms of spinning", cpu, ok)
	}
	if total, groups := treeRSS(os.Getpid()); total < rss || groups[GroupOther] < rss {
		t.Errorf("this process's tree: %d bytes, groups %v; want the child's %d in it", total, groups, rss)
	}
}

func vmRSS(t *testing.T, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
