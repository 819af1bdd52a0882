package session_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/session"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestNeverStaleImages is the stale-output matrix of `images`, as
// TestNeverStaleBinaries is of `binaries`: each scenario does something to
// a built copy of this repository, builds its images into the folder the
// earlier builds wrote, and compares each index digest with a clean build
// of a copy of the tree as the scenario left it (new to the daemon's
// transfer of the sources, a new output folder, -rebuild), run after every
// scenario. Zero may differ.
func TestNeverStaleImages(t *testing.T) {
	testdaemon.Shared(t)
	ctx := context.Background()
	root := t.TempDir()
	testdaemon.CopyTree(t, testdaemon.RepoRoot(t), root)
	path := func(name string) string { return filepath.Join(root, filepath.FromSlash(name)) }
	edit := func(name, old, new string) {
		t.Helper()
		data, err := os.ReadFile(path(name))
		if err != nil {
			t.Fatal(err)
		}
		edited := strings.Replace(string(data), old, new, 1)
		if edited == string(data) {
			t.Fatalf("%s holds no %q", name, old)
		}
		if err := os.WriteFile(path(name), []byte(edited), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// keepStat rewrites name with the size and modification time it had.
	keepStat := func(name, old, new string) {
		t.Helper()
		fi, err := os.Stat(path(name))
		if err != nil {
			t.Fatal(err)
		}
		if len(old) != len(new) {
			t.Fatalf("%q and %q differ in length", old, new)
		}
		edit(name, old, new)
		if err := os.Chtimes(path(name), fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	// The agent image carries a file of its folder, dated an hour back.
	script := path("images/antrea-agent/hello.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho one\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(script, past, past)
	// And the agent a file of its own, dated so too.
	matrix := path("pkg/agent/matrix.go")
	if err := os.WriteFile(matrix, []byte("package agent\n\nimport \"os\"\n\nvar matrixWord = \"one\"\n\nfunc init() {\n\tif len(os.Args) > 99 {\n\t\tprintln(matrixWord)\n\t}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(matrix, past, past)
	edit("images/antrea-agent/image.yaml", "workdir: /\n", "workdir: /\nfiles:\n  - {src: hello.sh, dest: /usr/local/bin/hello.sh, mode: \"0755\"}\n")
	testdaemon.Git(t, root, "add", "-A")
	testdaemon.Git(t, root, "commit", "-qm", "the matrix's tree")

	out := t.TempDir()
	agent := filepath.Join(out, "images", "antrea-agent.oci.tar")
	build := func(tree, into string, rebuild bool) map[string]string {
		t.Helper()
		o, err := session.Images(ctx, session.Options{Root: tree, Platforms: "linux/amd64", OutDir: into, Progress: "quiet", Rebuild: rebuild})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, img := range o.Images {
			got[img.Name] = img.Digest
		}
		return got
	}
	build(root, out, false)

	type run struct {
		name, tree string
		env        map[string]string
		got        map[string]string
	}
	var runs []run
	for _, sc := range []struct {
		name string
		env  map[string]string
		do   func(t *testing.T)
	}{
		{name: "nothing changed", do: func(*testing.T) {}},
		{name: "an image.yaml label changed", do: func(*testing.T) {
			edit("images/antrea-agent/image.yaml", "title: antrea-agent", "title: antrea-agent-x")
		}},
		{name: "source: changed in kiln.yaml", do: func(*testing.T) {
			edit("build/kiln.yaml", "source: https://github.com/kiln-build/kiln", "source: https://github.com/kiln-build/kiln2")
		}},
		{name: "a new commit, SOURCE_DATE_EPOCH fixed", env: map[string]string{"SOURCE_DATE_EPOCH": "1800000000"}, do: func(*testing.T) {
			testdaemon.Git(t, root, "commit", "-qam", "labels")
		}},
		{name: "and another, with nothing else changed", env: map[string]string{"SOURCE_DATE_EPOCH": "1800000000"}, do: func(*testing.T) {
			testdaemon.Git(t, root, "commit", "-q", "--allow-empty", "-m", "empty")
		}},
		{name: "an image file edited", do: func(*testing.T) { edit("images/antrea-agent/hello.sh", "echo one", "echo two") }},
		{name: "an image file edited keeping size and time", do: func(*testing.T) {
			keepStat("images/antrea-agent/hello.sh", "echo two", "echo six")
		}},
		{name: "an agent source edited keeping size and time", do: func(*testing.T) {
			keepStat("pkg/agent/matrix.go", `"one"`, `"two"`)
		}},
		{name: ".dockerignore changed", do: func(*testing.T) { testdaemon.AppendLine(t, path(".dockerignore"), "docs/\n") }},
		{name: "a tarball truncated", do: func(t *testing.T) {
			if err := os.Truncate(agent, 4096); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a tarball's byte flipped keeping its size and time", do: func(t *testing.T) {
			fi, err := os.Stat(agent)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(agent)
			data[len(data)/2] ^= 0xff
			os.WriteFile(agent, data, 0o644)
			os.Chtimes(agent, fi.ModTime(), fi.ModTime())
		}},
	} {
		for k, v := range sc.env {
			t.Setenv(k, v)
		}
		sc.do(t)
		snapshot := t.TempDir()
		testdaemon.CopyTree(t, root, snapshot)
		runs = append(runs, run{name: sc.name, tree: snapshot, env: sc.env, got: build(root, out, false)})
		for k := range sc.env {
			os.Unsetenv(k)
		}
	}
	for _, r := range runs {
		for k, v := range r.env {
			t.Setenv(k, v)
		}
		want := build(r.tree, t.TempDir(), true)
		verdict := "fresh"
		for name, digest := range want {
			if r.got[name] != digest {
				verdict = "STALE"
				t.Errorf("%s: %s kept %s where a clean build writes %s", r.name, name, r.got[name], digest)
			}
		}
		t.Logf("%-5s %s", verdict, r.name)
		for k := range r.env {
			os.Unsetenv(k)
		}
	}
}

// TestAnImageFileEditedWhileTheDaemonReadsIsNeverRecordedAsBuilt: an image
// file changed between kiln reading the inputs for the keys and the daemon
// reading them leaves no record of the tarball as made from what the keys
// name; with the file as the keys said, the next build writes that image.
func TestAnImageFileEditedWhileTheDaemonReadsIsNeverRecordedAsBuilt(t *testing.T) {
	testdaemon.Shared(t)
	ctx := context.Background()
	root := t.TempDir()
	testdaemon.CopyTree(t, testdaemon.RepoRoot(t), root)
	script := filepath.Join(root, "images", "antrea-controller", "hello.sh")
	write := func(word string) {
		if err := os.WriteFile(script, []byte("#!/bin/sh\necho "+word+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("one")
	yaml := filepath.Join(root, "images", "antrea-controller", "image.yaml")
	data, err := os.ReadFile(yaml)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(yaml, []byte(strings.Replace(string(data), "workdir: /\n", "workdir: /\nfiles:\n  - {src: hello.sh, dest: /usr/local/bin/hello.sh, mode: \"0755\"}\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	opts := session.Options{Root: root, Platforms: "linux/amd64", Images: []string{"antrea-controller"}, OutDir: out, Progress: "quiet"}
	build := func() string {
		t.Helper()
		o, err := session.Images(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		return o.Images[0].Digest
	}
	one := build()
	write("two")
	defer session.BeforeSolve(func() { write("six") })()
	six := build() // the keys say two; the daemon read six
	session.BeforeSolve(nil)
	write("two")
	if two := build(); two == six || two == one {
		t.Errorf("with the file as the keys said: %s, the image the daemon read mid-build (%s) or the first (%s)", two, six, one)
	}
}
