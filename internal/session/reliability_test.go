package session_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/buildkit/managed"
	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// descendants lists the pids under pid.
func descendants(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(data)) {
			if child, err := strconv.Atoi(f); err == nil {
				out = append(out, child)
				out = append(out, descendants(child)...)
			}
		}
	}
	return out
}

// compiling reports whether a go command runs as a build step under pid.
func compiling(pid int) bool {
	for _, p := range descendants(pid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if bytes.HasPrefix(cmdline, []byte("/usr/local/go/bin/go\x00")) {
			return true
		}
	}
	return false
}

func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func hashDir(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = sha256.Sum256(data)
	}
	return out
}

// pruneToGoCache removes every record of the daemon but its Go build cache
// mount: the next build's go build relinks every binary (its kept binaries
// are gone) without compiling the standard library again, which leaves a
// second or two in which a go command runs in a step.
func pruneToGoCache(t *testing.T, m *managed.Managed, root string) {
	t.Helper()
	p, err := session.Plan(session.Options{Root: root, Platforms: "linux/amd64"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := buildkit.Dial(context.Background(), m.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	usage, err := c.DiskUsage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var filters []string
	for _, u := range usage {
		if !strings.HasSuffix(u.Description, fmt.Sprintf("with id %q", p.Cache.GoCache)) {
			filters = append(filters, "id=="+u.ID)
		}
	}
	if len(filters) == len(usage) {
		t.Fatalf("no Go cache mount %q among the daemon's records", p.Cache.GoCache)
	}
	if err := c.Prune(context.Background(), nil, client.PruneAll, client.WithFilter(filters)); err != nil {
		t.Fatal(err)
	}
}

// TestOneManagedDaemon runs builds that need a managed daemon of their own
// but not a cold one each, on the daemon the first part starts: concurrent
// first starts, the context's .dockerignore, an interrupted build, and last
// a build whose daemon is killed.
func TestOneManagedDaemon(t *testing.T) {
	m := testdaemon.ManagedCache(t)
	mage := testdaemon.MageBinary(t)

	t.Run("concurrent builds start one daemon and agree", func(t *testing.T) {
		tree := t.TempDir()
		testdaemon.CopyTree(t, testdaemon.RepoRoot(t), tree)

		outputs := make([]string, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i := range outputs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(mage, "images", "-platforms=linux/amd64", "-progress=quiet")
				cmd.Dir = tree
				out, err := cmd.CombinedOutput()
				outputs[i], errs[i] = string(out), err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("build %d: %v\n%s", i, err, outputs[i])
			}
		}
		digests := func(out string) []string {
			var d []string
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Split(line, "\t"); len(f) >= 2 && strings.HasPrefix(f[1], "sha256:") {
					d = append(d, f[0]+" "+f[1])
				}
			}
			return d
		}
		a, b := digests(outputs[0]), digests(outputs[1])
		if len(a) != 2 || fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("the two builds disagree:\n%v\n%v", a, b)
		}
		log, err := os.ReadFile(m.LogFile())
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(log), "running server on"); n != 1 {
			t.Errorf("%d daemons started, want 1", n)
		}
	})

	t.Run("dockerignored files never reach BuildKit", func(t *testing.T) {
		tree := t.TempDir()
		testdaemon.CopyTree(t, testdaemon.RepoRoot(t), tree)
		secret := []byte("KILN_CANARY_SECRET_" + strconv.Itoa(os.Getpid()) + "_do_not_leak")
		control := []byte("KILN_CANARY_CONTROL_" + strconv.Itoa(os.Getpid()))
		if err := os.WriteFile(filepath.Join(tree, ".env"), append([]byte("API_TOKEN="), secret...), 0o600); err != nil {
			t.Fatal(err)
		}
		// The control rides in a file the build sends: a Go source. kiln sends
		// only the files go reads (and those an image copies), so a README
		// never reaches BuildKit at all.
		testdaemon.AppendLine(t, filepath.Join(tree, "pkg", "version", "version.go"), "\n// "+string(control)+"\n")
		unread := []byte("KILN_CANARY_UNREAD_" + strconv.Itoa(os.Getpid()))
		testdaemon.AppendLine(t, filepath.Join(tree, "README.md"), "\n"+string(unread)+"\n")

		out, err := session.Images(context.Background(), session.Options{Root: tree, Platforms: "linux/amd64", Progress: "plain", OutDir: filepath.Join(tree, "_output")})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := testdaemon.GrepTree(m.Dir, control); !ok {
			t.Fatal("the control file did not reach BuildKit either: the search proves nothing")
		}
		if path, ok := testdaemon.GrepTree(m.Dir, secret); ok {
			t.Errorf("the .dockerignore'd .env reached BuildKit: %s", path)
		}
		if path, ok := testdaemon.GrepTree(m.Dir, unread); ok {
			t.Errorf("the README, which no build reads, reached BuildKit: %s", path)
		}
		for _, img := range out.Images {
			data, _ := os.ReadFile(img.Path)
			if bytes.Contains(data, secret) {
				t.Errorf("%s contains the canary", img.Path)
			}
		}
	})
	t.Run("an interrupt exits 130 and leaves nothing partial", func(t *testing.T) {
		tree := t.TempDir()
		testdaemon.CopyTree(t, testdaemon.RepoRoot(t), tree)
		pruneToGoCache(t, m, tree)
		pid, _ := m.PID()

		cmd := exec.Command(mage, "images", "-platforms=linux/amd64", "-progress=plain")
		cmd.Dir = tree
		var output bytes.Buffer
		cmd.Stdout, cmd.Stderr = &output, &output
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "a compile step", 2*time.Minute, func() bool { return compiling(pid) })
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 130 {
			t.Fatalf("exit %v after SIGINT, want 130\n%s", err, output.String())
		}
		entries, _ := os.ReadDir(filepath.Join(tree, "_output", "images"))
		for _, e := range entries {
			t.Errorf("partial output left: %s", e.Name())
		}

		// The daemon is healthy: the next build completes.
		again := exec.Command(mage, "images", "-platforms=linux/amd64", "-progress=quiet")
		again.Dir = tree
		if out, err := again.CombinedOutput(); err != nil {
			t.Fatalf("the build after the interrupt: %v\n%s", err, out)
		}
		if newPid, _ := m.PID(); newPid != pid {
			t.Errorf("the daemon was restarted (pid %d, was %d); it should have survived the interrupt", newPid, pid)
		}
	})

	// Last: it kills the daemon.
	t.Run("a daemon killed mid-build fails the build and leaves the outputs", func(t *testing.T) {
		ctx := context.Background()
		out := t.TempDir()
		opts := session.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64", Progress: "quiet", OutDir: out}
		first, err := session.Images(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		before := hashDir(t, filepath.Join(out, "images"))
		pruneToGoCache(t, m, opts.Root) // so that the next build runs go
		opts.Rebuild = true             // the outputs are up to date: build them anyway

		errc := make(chan error, 1)
		go func() {
			_, err := session.Images(ctx, opts)
			errc <- err
		}()
		pid, _ := m.PID()
		waitUntil(t, "a compile step", 2*time.Minute, func() bool { return compiling(pid) })
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err = <-errc
		if err == nil {
			t.Fatal("the build succeeded although its daemon was killed")
		}
		if !strings.Contains(err.Error(), "died") {
			t.Errorf("error does not say the daemon died: %v", err)
		}
		if after := hashDir(t, filepath.Join(out, "images")); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("the previous outputs changed: %v, then %v", before, after)
		}

		again, err := session.Images(ctx, opts)
		if err != nil {
			t.Fatalf("the build after the kill: %v", err)
		}
		if newPid, ok := m.Running(); !ok || newPid == pid {
			t.Errorf("the daemon was not restarted (pid %d, was %d)", newPid, pid)
		}
		sameDigests(t, first.Images, again.Images)
	})
}
