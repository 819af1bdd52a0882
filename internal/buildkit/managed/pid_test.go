package managed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// A pid file that outlived its daemon may name a process that reuses the
// pid: kiln must not signal it.
func TestStalePidFileNeverSignalsAnotherProcess(t *testing.T) {
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	dir := t.TempDir()
	m := &Managed{Dir: dir, BinDir: filepath.Join(dir, "bin")}
	if err := os.WriteFile(m.pidFile(), []byte(strconv.Itoa(sleep.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, running := m.Running(); running {
		t.Error("a sleep process counts as the managed buildkitd")
	}
	stopped, err := m.Stop(context.Background())
	if err != nil || stopped {
		t.Errorf("Stop = %v, %v; want nothing stopped", stopped, err)
	}
	if err := sleep.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the unrelated process was signalled: %v", err)
	}
}

// TestStopStopsTheDaemonAnOlderKilnStarted: after an upgrade the managed
// daemon still runs the buildkitd file the older kiln built (another name
// in the same BinDir); buildkit:stop stops it. The same program outside
// BinDir is not kiln's, and is left alone.
func TestStopStopsTheDaemonAnOlderKilnStarted(t *testing.T) {
	shPath, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile(shPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m := &Managed{Dir: dir, BinDir: filepath.Join(dir, "bin")}
	for _, c := range []struct {
		path string
		ours bool
	}{
		{filepath.Join(m.BinDir, "buildkitd-v0.0.1"), true},
		{filepath.Join(dir, "elsewhere", "buildkitd-v0.0.1"), false},
	} {
		os.MkdirAll(filepath.Dir(c.path), 0o755)
		if err := os.WriteFile(c.path, prog, 0o755); err != nil {
			t.Fatal(err)
		}
		// A shell that waits on a pipe, its arguments a daemon's.
		daemon := exec.Command(c.path, "-c", "read x", "--root", m.stateDir())
		stdin, err := daemon.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		defer stdin.Close()
		if err := daemon.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { daemon.Wait(); close(done) }()
		os.WriteFile(m.pidFile(), []byte(strconv.Itoa(daemon.Process.Pid)+"\n"), 0o600)
		// Just after exec the kernel may show an empty command line.
		for i := 0; i < 200; i++ {
			if cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", daemon.Process.Pid)); len(cl) > 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		stopped, err := m.Stop(context.Background())
		if err != nil || stopped != c.ours {
			t.Errorf("%s: Stop = %v, %v; want stopped %v", c.path, stopped, err, c.ours)
		}
		if !c.ours {
			if err := daemon.Process.Signal(syscall.Signal(0)); err != nil {
				t.Errorf("%s, outside BinDir, was signalled: %v", c.path, err)
			}
		}
		daemon.Process.Kill()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not end", c.path)
		}
	}
}

// A start ends only the steps of an earlier daemon on its own state: never
// those of a daemon on another state (here one whose path the state's is a
// prefix of), nor any while a buildkitd holds the state's lock.
func TestAStartEndsOnlyTheStepsLeftOnItsOwnState(t *testing.T) {
	dir := t.TempDir()
	m := &Managed{Dir: filepath.Join(dir, "buildkit")}
	state := m.stateDir()
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	bin, deleted := t.TempDir(), filepath.Join(dir, "deleted")
	executor := filepath.Join(state, "runc-overlayfs", "executor")
	list := fmt.Sprintf(`[{"id":"left","status":"running","bundle":%q},{"id":"stopped","status":"stopped","bundle":%q},{"id":"other","status":"running","bundle":%q}]`,
		filepath.Join(executor, "left"), filepath.Join(executor, "stopped"), filepath.Join(state+"2", "runc-overlayfs", "executor", "other"))
	runc := "#!/bin/sh\ncase \"$1\" in\nlist) echo '" + list + "' ;;\ndelete) echo \"$*\" >>" + deleted + " ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(bin, "runc"), []byte(runc), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))

	lock, err := os.Create(filepath.Join(state, "buildkitd.lock"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	m.reapSteps(context.Background())
	if dt, err := os.ReadFile(deleted); err == nil {
		t.Errorf("while a buildkitd held the state's lock, its steps were deleted: %s", dt)
	}
	lock.Close()

	m.reapSteps(context.Background())
	dt, _ := os.ReadFile(deleted)
	if got := string(dt); got != "delete --force left\ndelete --force stopped\n" {
		t.Errorf("runc was asked to %q, want the two containers on this state deleted, not the other state's", got)
	}
}
