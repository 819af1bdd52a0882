package measure

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// DeadMemoryCgroups counts the memory cgroups the kernel still holds after
// their removal: every step BuildKit runs gets one, and it stays while page
// cache charged to it lives (the Go cache's files, the outputs). Hundreds
// of them were seen to slow every compile, kiln's steps the most (a tenth
// to a fifth more CPU). -1 when the count cannot be read.
func DeadMemoryCgroups() int {
	// cgroup v2: the root's count of dying descendants (of every
	// controller; a dying cgroup that outlives its step is kept by memory).
	if dt, err := os.ReadFile("/sys/fs/cgroup/cgroup.stat"); err == nil {
		for _, line := range strings.Split(string(dt), "\n") {
			if v, ok := strings.CutPrefix(line, "nr_dying_descendants "); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					return n
				}
			}
		}
		return -1
	}
	// cgroup v1: the memory controller's count, less the live ones (the
	// whole hierarchy mounted, as on a machine, not a container).
	all := memoryCgroupCount()
	if all < 0 {
		return -1
	}
	live := 0
	err := filepath.WalkDir("/sys/fs/cgroup/memory", func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			live++
		}
		return nil
	})
	if err != nil || live == 0 {
		return -1
	}
	return max(all-live, 0)
}

// memoryCgroupCount is /proc/cgroups' num_cgroups of the memory controller.
func memoryCgroupCount() int {
	f, err := os.Open("/proc/cgroups")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 4 && fields[0] == "memory" {
			if n, err := strconv.Atoi(fields[2]); err == nil {
				return n
			}
		}
	}
	return -1
}

// DropPageCache writes back and drops the page cache, which frees the dead
// memory cgroups it kept. Only root may.
func DropPageCache() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}
