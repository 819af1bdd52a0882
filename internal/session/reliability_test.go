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

	"github.com/kiln-build/kiln/internal/modfixture"
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

// slowTinyRepo is testdaemon.TinyRepo (linux/amd64) whose binary also
// imports a package of 6,000 functions, which takes go about two seconds
// to compile: long enough for a test to catch go mid-build, for a few
// CPU-seconds where this repository's cold compile takes fifty. An edit
// to it (editSlow) makes go run again without changing the binary.
func slowTinyRepo(t *testing.T) string {
	t.Helper()
	root := testdaemon.TinyRepo(t, "[linux/amd64]")
	var src strings.Builder
	src.WriteString("package slow\n\n")
	var all []string
	for i := range 6000 {
		fmt.Fprintf(&src, "func F%d(a, b int) int {\n\tfor i := 0; i < a; i++ {\n\t\tif b%%%d == %d {\n\t\t\tb += i * %d\n\t\t} else {\n\t\t\tb ^= a << %d\n\t\t}\n\t}\n\treturn b\n}\n\n", i, i+3, i%7, i, i%13)
		all = append(all, fmt.Sprintf("F%d", i))
	}
	fmt.Fprintf(&src, "var All = []func(int, int) int{%s}\n", strings.Join(all, ", "))
	modfixture.Write(t, root, map[string]string{
		"pkg/slow/slow.go": src.String(),
		"cmd/tiny/main.go": "package main\n\nimport (\n\t\"example.com/tiny/pkg/slow\"\n\t\"example.com/tiny/pkg/version\"\n)\n\nfunc main() { println(version.Version, len(slow.All)) }\n",
		".dockerignore":    ".env\n",
	})
	testdaemon.Git(t, root, "add", "-A")
	testdaemon.Git(t, root, "commit", "-qm", "slow")
	testdaemon.Git(t, root, "tag", "-f", "v1.0.0")
	return root
}

// editSlow appends a comment new to every run to the slow package: go
// compiles it again, and the binary stays the same (a dirty tree is
// stamped alike before and after).
func editSlow(t *testing.T, root string) {
	t.Helper()
	testdaemon.AppendLine(t, filepath.Join(root, "pkg", "slow", "slow.go"), fmt.Sprintf("\n// edit %d\n", time.Now().UnixNano()))
}

// TestOneManagedDaemon runs builds that need a managed daemon of their own
// but not a cold one each, on the daemon the first part starts: concurrent
// first starts, the context's .dockerignore, an interrupted build, and last
// a build whose daemon is killed. They build slowTinyRepo: what they test
// does not depend on what compiles, only on a compile long enough to catch.
func TestOneManagedDaemon(t *testing.T) {
	m := testdaemon.ManagedCache(t)
	mage := testdaemon.MageBinary(t)
	repo := slowTinyRepo(t)

	t.Run("concurrent builds start one daemon and agree", func(t *testing.T) {
		tree := t.TempDir()
		testdaemon.CopyTree(t, repo, tree)

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
		if len(a) != 1 || fmt.Sprint(a) != fmt.Sprint(b) {
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
		testdaemon.CopyTree(t, repo, tree)
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
		if err := os.WriteFile(filepath.Join(tree, "README.md"), append(unread, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}

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
		testdaemon.CopyTree(t, repo, tree)
		editSlow(t, tree)
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
		tree, out := t.TempDir(), t.TempDir()
		testdaemon.CopyTree(t, repo, tree)
		editSlow(t, tree) // dirty, as the killed build's tree will be
		opts := session.Options{Root: tree, Platforms: "linux/amd64", Progress: "quiet", OutDir: out}
		first, err := session.Images(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		before := hashDir(t, filepath.Join(out, "images"))
		editSlow(t, tree) // so that the next build runs go

		errc := make(chan error, 1)
		go func() {
			_, err := session.Images(ctx, opts)
			errc <- err
		}()
		pid, _ := m.PID()
		waitUntil(t, "a compile step", 2*time.Minute, func() bool { return compiling(pid) })
		steps := descendants(pid)
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

		// Its steps outlive it, in the middle of writing the cache mounts
		// the next daemon's steps take as their own: the next daemon's
		// start ends them. (They once deleted the work folder of the next
		// go build, which failed.)
		c, err := m.Ensure(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		for _, p := range steps {
			if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil && !bytes.Contains(stat, []byte(") Z ")) {
				t.Errorf("a step process of the killed daemon runs on beside the new daemon: %s", stat)
			}
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
