package testdaemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/containerd"
)

// Containerd starts Debian's containerd with its own root, state and
// socket, and points CONTAINERD_ADDRESS at it for the test.
func Containerd(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs containerd")
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		Unavailable(t, "containerd not found: apt-get install -y containerd")
	}
	dir, err := os.MkdirTemp("", "kiln-ctd-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc")
	write(t, filepath.Join(dir, "config.toml"), cfg)
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		exec.Command("umount", "-R", filepath.Join(dir, "root")).Run()
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := containerd.Connect(context.Background(), sock)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			Unavailable(t, "containerd did not start: %v\n%s", err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Setenv(containerd.AddressEnv, sock)
	return sock
}
