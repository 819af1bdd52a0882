package measure

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// processStat reads what /proc/PID/status says: a child's command name,
// and a resident set that grows with what the child touches; ProcessCPU
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
	// Spin until the kernel's own count says 100 ms of CPU were spent: on a
	// busy machine 100 ms of wall time can hold far less. ProcessCPU counts
	// the children reaped too.
	spent := func() time.Duration {
		var total time.Duration
		for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
			var ru syscall.Rusage
			if err := syscall.Getrusage(who, &ru); err != nil {
				t.Fatal(err)
			}
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
		return total
	}
	from := spent()
	for start := time.Now(); spent()-from < 100*time.Millisecond; {
		if time.Since(start) > time.Minute {
			t.Fatal("100 ms of CPU not spent in a minute")
		}
	}
	// /proc's count is in clock ticks (10 ms).
	self, children, ok := ProcessCPU(os.Getpid())
	cpu := self + children
	if total := spent(); !ok || cpu < from+100*time.Millisecond-20*time.Millisecond || cpu > total+20*time.Millisecond {
		t.Errorf("this process's CPU: %v (%v); getrusage says %v before spinning 100 ms of CPU, %v after", cpu, ok, from, total)
	}
	if own := SelfCPU(); self < 100*time.Millisecond-20*time.Millisecond || self > own+20*time.Millisecond {
		t.Errorf("this process's own CPU: %v; getrusage says %v, after spinning 100 ms of CPU", self, own)
	}
	if total, groups, _ := treeRSS(os.Getpid()); total < rss || groups[GroupOther] < rss {
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

// TestSystemMemoryCountsTmpfs: 2 GiB in a tmpfs file, which no process
// holds resident, shows in Shmem and in the machine's used memory: its
// removal frees it. The kernel folds its per-CPU counters into
// /proc/meminfo about once a second, so each reading waits for that; other
// processes (the other packages' tests) move used memory too, and under a
// concurrent build only 60-75% of a freed GiB showed, so half is asked
// for, and a try in which something else moved it is made again.
func TestSystemMemoryCountsTmpfs(t *testing.T) {
	const size = 2 << 30
	var tries []string
	for range 5 {
		f, err := os.CreateTemp("/dev/shm", "kiln-bench-")
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Write(make([]byte, size))
		f.Close()
		if err != nil {
			os.Remove(f.Name())
			t.Fatal(err)
		}
		time.Sleep(meminfoSettles)
		used, shmem, ok := systemMemory()
		os.Remove(f.Name())
		time.Sleep(meminfoSettles)
		usedAfter, shmemAfter, _ := systemMemory()
		if !ok {
			t.Fatal("/proc/meminfo has no MemTotal or MemAvailable")
		}
		if shmem-shmemAfter >= size*3/4 && used-usedAfter >= size/2 {
			return
		}
		tries = append(tries, fmt.Sprintf("used %d, Shmem %d", used-usedAfter, shmem-shmemAfter))
	}
	t.Errorf("removing %d bytes of tmpfs freed, in five tries: %v", size, tries)
}

// meminfoSettles is how long /proc/meminfo takes to show a change: the
// kernel's vmstat interval is one second.
const meminfoSettles = 1500 * time.Millisecond

// A memory cgroup that charged page cache and was removed is counted dead.
func TestDeadMemoryCgroupsAreCounted(t *testing.T) {
	parent := "/sys/fs/cgroup/memory" // v1
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.stat"); err == nil {
		parent = "/sys/fs/cgroup" // v2
	}
	if _, err := os.Stat(parent); err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI runs as root on Linux with a memory cgroup hierarchy (%v)", err)
		}
		t.Skip("needs root and a memory cgroup hierarchy")
	}
	before := DeadMemoryCgroups()
	if before < 0 {
		t.Fatal("DeadMemoryCgroups cannot read the count")
	}
	// Three, so that a step starting meanwhile (counted live by the walk
	// but not yet by the kernel's total) cannot hide them all.
	const made = 3
	for i := range made {
		cg := filepath.Join(parent, fmt.Sprintf("kiln-test-%d-%d", os.Getpid(), i))
		if err := os.Mkdir(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "charged")
		// The shell moves itself into the cgroup, then writes 1 MiB of page cache charged to it.
		script := fmt.Sprintf("echo $$ > %s/cgroup.procs && head -c 1048576 /dev/zero > %s", cg, file)
		if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			os.Remove(cg)
			t.Fatalf("%v: %s", err, out)
		}
		if err := os.Remove(cg); err != nil {
			t.Fatal(err)
		}
	}
	if after := DeadMemoryCgroups(); after < before+made-1 {
		t.Errorf("dead memory cgroups: %d before, %d after removing %d that hold page cache", before, after, made)
	}
}
