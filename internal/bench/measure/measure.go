// Package measure owns measuring a build as the machine feels it: wall
// time, CPU of a process tree, resident memory by process group, the
// machine's used memory and what tmpfs held.
package measure

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Sample is one measured run.
type Sample struct {
	Wall    time.Duration
	CPU     time.Duration // -1 when it cannot be read
	PeakRSS int64         // bytes; -1 when it cannot be read
	// Peaks is the largest resident memory of each process group.
	Peaks map[string]int64
	// System is the machine's memory as a user feels it: the peak of used
	// memory (MemTotal - MemAvailable) during the run, less what was used
	// at its start; page cache the kernel can drop is not counted, tmpfs
	// is. -1 when it cannot be read.
	System int64
	// Tmpfs is what tmpfs and shared memory (Shmem) held at that peak, over
	// what they held at the start; TmpfsMounts splits the build's tmpfs
	// mounts by mount point (each step's /tmp, summed over the steps).
	Tmpfs       int64
	TmpfsMounts map[string]int64
	// CPUBy splits a kiln build's CPU: the daemon's own, the steps' (the
	// daemon's reaped children) and the client's.
	CPUBy map[string]time.Duration
	// Sent are the binaries a kiln build sent, relative to its output.
	Sent []string
}

// Process groups of the memory breakdown: what a build runs, by name.
const (
	GroupBuildkitd = "buildkitd"
	GroupRunc      = "runc"
	GroupGo        = "go"
	GroupCompile   = "compile"
	GroupLink      = "link"
	GroupClient    = "kiln client"
	GroupOther     = "other"
)

// processGroup names the group of a process by its comm (at most 15
// bytes: kiln's daemon is buildkitd-v0.34.2-<key>, seen as buildkitd-v0.34).
func processGroup(comm string) string {
	switch {
	case strings.HasPrefix(comm, "buildkitd"):
		return GroupBuildkitd
	case strings.Contains(comm, "runc"):
		return GroupRunc
	}
	switch comm {
	case "go":
		return GroupGo
	case "compile", "asm", "cgo":
		return GroupCompile
	case "link":
		return GroupLink
	}
	return GroupOther
}

// treeRSS sums the resident memory of a process and its descendants, in
// total and by process group; pids are the processes.
func treeRSS(pid int) (int64, map[string]int64, []int) {
	var total int64
	var pids []int
	groups := map[string]int64{}
	seen := map[int]bool{}
	var walk func(int)
	walk = func(p int) {
		if seen[p] {
			return
		}
		seen[p] = true
		pids = append(pids, p)
		if comm, rss := processStat(p); rss > 0 {
			total += rss
			groups[processGroup(comm)] += rss
		}
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p))
		for _, t := range tasks {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", p, t.Name()))
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(data)) {
				if child, err := strconv.Atoi(c); err == nil {
					walk(child)
				}
			}
		}
	}
	walk(pid)
	return total, groups, pids
}

// pageSize is the unit of the resident set in /proc/PID/stat.
var pageSize = int64(os.Getpagesize())

// processStat is one process's command name and resident memory in bytes,
// read from the one file that has both.
func processStat(pid int) (string, int64) {
	comm, f, ok := procStat(pid)
	if !ok || len(f) < 22 {
		return "", 0
	}
	pages, _ := strconv.ParseInt(f[21], 10, 64) // rss, field 24 of stat
	return comm, pages * pageSize
}

// procStat reads /proc/PID/stat: the command name, which may hold spaces,
// and the fields after it, the state first.
func procStat(pid int) (comm string, fields []string, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", nil, false
	}
	s := string(data)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	return s[open+1 : end], strings.Fields(s[end+1:]), true
}

// Peak records the largest treeRSS of a process while it runs, with
// the largest of each process group; with client set, this process (kiln's
// client, in process) counts too. It records the machine's used memory
// too, with what tmpfs held at its peak.
type Peak struct {
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	peak  int64
	peaks map[string]int64
	// The machine's used memory and Shmem at the start and at the peak of
	// used memory, and the tmpfs mounts of the process tree then.
	usedBase, shmemBase int64
	usedPeak, shmemPeak int64
	mountsPeak          map[string]int64
	systemOK            bool
}

const sampleEvery = 100 * time.Millisecond

// SamplePeak starts a Peak, sampling every 100 ms until Stop: the tree of
// the process pid returns (none while it returns 0) and the machine's memory.
func SamplePeak(pid func() int, client bool) *Peak {
	s := &Peak{stop: make(chan struct{}), done: make(chan struct{}), peaks: map[string]int64{}}
	s.usedBase, s.shmemBase, s.systemOK = systemMemory()
	s.usedPeak, s.shmemPeak = s.usedBase, s.shmemBase
	go func() {
		defer close(s.done)
		// A sample of kiln's tree costs about 3 ms of CPU that the
		// build does not get: every 50 ms it was 6% of a core.
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			var pids []int
			if p := pid(); p > 0 {
				rss, groups, tree := treeRSS(p)
				pids = tree
				if client {
					_, groups[GroupClient] = processStat(os.Getpid())
					rss += groups[GroupClient]
				}
				s.mu.Lock()
				s.peak = max(s.peak, rss)
				for g, n := range groups {
					s.peaks[g] = max(s.peaks[g], n)
				}
				s.mu.Unlock()
			}
			if used, shmem, ok := systemMemory(); ok && s.systemOK && used > s.usedPeak {
				mounts := tmpfsMounts(pids)
				s.mu.Lock()
				s.usedPeak, s.shmemPeak, s.mountsPeak = used, shmem, mounts
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends the sampling and returns the peak total and the peak of each
// process group (the groups peak at different times, so they add up to
// more than the total).
func (s *Peak) Stop() (int64, map[string]int64) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak, s.peaks
}

// System fills in the machine's memory: the peak of used memory over the
// start, and what tmpfs held then. Call after Stop.
func (s *Peak) System(x *Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x.System, x.Tmpfs, x.TmpfsMounts = -1, -1, nil
	if s.systemOK {
		x.System, x.Tmpfs, x.TmpfsMounts = s.usedPeak-s.usedBase, max(s.shmemPeak-s.shmemBase, 0), s.mountsPeak
	}
}

// AddSystem keeps the larger machine memory peak of s and the sample's
// (the runs of one scenario one after another).
func (x *Sample) AddSystem(s Sample) {
	if x.System == 0 && x.Tmpfs == 0 && x.TmpfsMounts == nil || s.System > x.System {
		x.System, x.Tmpfs, x.TmpfsMounts = s.System, s.Tmpfs, s.TmpfsMounts
	}
}

// systemMemory is the machine's used memory (MemTotal - MemAvailable) and
// its Shmem (tmpfs and shared memory), in bytes.
func systemMemory() (used, shmem int64, ok bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	fields := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		name, value, found := strings.Cut(line, ":")
		if !found {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		fields[name] = kb << 10
	}
	total, hasTotal := fields["MemTotal"]
	available, hasAvailable := fields["MemAvailable"]
	if !hasTotal || !hasAvailable {
		return 0, 0, false
	}
	return total - available, fields["Shmem"], true
}

// tmpfsMounts is what the tmpfs mounts of the processes' mount namespaces
// (BuildKit's steps) hold, by mount point, each namespace counted once;
// /dev and the namespaces of this process are left out.
func tmpfsMounts(pids []int) map[string]int64 {
	own, _ := os.Readlink("/proc/self/ns/mnt")
	seen := map[string]bool{own: true}
	var mounts map[string]int64
	for _, pid := range pids {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
			pre, post, ok := strings.Cut(line, " - ")
			f, g := strings.Fields(pre), strings.Fields(post)
			if !ok || len(f) < 5 || len(g) < 1 || g[0] != "tmpfs" || f[4] == "/dev" || strings.HasPrefix(f[4], "/dev/") {
				continue
			}
			var st syscall.Statfs_t
			if syscall.Statfs(fmt.Sprintf("/proc/%d/root%s", pid, f[4]), &st) != nil {
				continue
			}
			if used := int64(st.Blocks-st.Bfree) * st.Bsize; used > 0 {
				if mounts == nil {
					mounts = map[string]int64{}
				}
				mounts[f[4]] += used
			}
		}
	}
	return mounts
}

// clockTick is USER_HZ, 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

// CPU groups of a kiln build: the daemon itself, the steps it ran (its
// reaped children: runc, go and go's tools), and the client.
const (
	CPUDaemon = "buildkitd"
	CPUSteps  = "steps"
	CPUClient = GroupClient
)

// ProcessCPU is the user+system time of a process itself and of its reaped
// children.
func ProcessCPU(pid int) (self, children time.Duration, ok bool) {
	_, f, ok := procStat(pid)
	if !ok || len(f) < 15 {
		return 0, 0, false
	}
	ticks := func(fields ...int) time.Duration {
		var n int64
		for _, i := range fields {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			n += v
		}
		return time.Duration(n) * clockTick
	}
	return ticks(11, 12), ticks(13, 14), true // utime stime, cutime cstime
}

// SelfCPU is the user+system time of this process.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RunCommand runs a host command, measuring wall time, CPU and peak memory.
func RunCommand(ctx context.Context, dir string, env []string, name string, args ...string) (Sample, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Sample{}, err
	}
	peak := SamplePeak(func() int { return cmd.Process.Pid }, false)
	err := cmd.Wait()
	wall := time.Since(start)
	rss, groups := peak.Stop()
	if err != nil {
		return Sample{}, fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	s := Sample{Wall: wall, CPU: -1, PeakRSS: rss, Peaks: groups}
	peak.System(&s)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		s.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		s.PeakRSS = max(s.PeakRSS, ru.Maxrss<<10)
	}
	return s, nil
}

// DirSize is the bytes of regular files under dir.
func DirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// MemTotal is the machine's memory in bytes.
func MemTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
