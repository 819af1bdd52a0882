package buildkit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
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
