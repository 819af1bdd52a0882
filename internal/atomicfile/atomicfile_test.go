package atomicfile

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestTempOutputsOfDeadWritersAreSwept(t *testing.T) {
	dir := t.TempDir()
	dest := filepath.Join(dir, "agent.oci.tar")
	dead := filepath.Join(dir, ".agent.oci.tar.tmp-999999999-1")
	live := filepath.Join(dir, ".agent.oci.tar.tmp-"+strconv.Itoa(os.Getpid())+"-2")
	other := filepath.Join(dir, ".controller.oci.tar.tmp-999999999-3")
	for _, f := range []string{dead, live, other} {
		if err := os.WriteFile(f, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Write(dest, func(w io.Writer) error { _, err := w.Write([]byte("whole")); return err }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Error("a dead writer's temporary file was kept")
	}
	if _, err := os.Stat(live); err != nil {
		t.Error("a running writer's temporary file was removed")
	}
	if _, err := os.Stat(other); err != nil {
		t.Error("another output's temporary file was removed")
	}
	fi, err := os.Stat(dest)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("output %v mode %v; want 0644 like go build's", err, fi.Mode())
	}
}
