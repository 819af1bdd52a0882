package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestNeverStaleBinaries is the stale-output matrix of `binaries`: each
// scenario does something to a built tree, builds it the way a user does
// (into the output folder the earlier builds wrote, every record kiln
// keeps there in play) and compares each binary's digest with a clean
// build of the same tree, where no record of an
// earlier build can stand in: a copy of the tree as the scenario left it
// (every file new to the daemon's transfer of the sources, the list
// cache's record keyed by another folder) built into a new folder with
// -rebuild, after every scenario ran, so that no clean build refreshes
// what the next scenario's build finds in the daemon. Zero may differ. It
// prints one line per scenario.
func TestNeverStaleBinaries(t *testing.T) {
	testdaemon.Shared(t)
	app := t.TempDir()
	modfixture.Write(t, app, map[string]string{
		"go.mod":                 "module example.com/app\n\ngo 1.26\n\nrequire example.com/dep v0.0.0\n\nreplace example.com/dep => ./dep\n",
		"dep/go.mod":             "module example.com/dep\n\ngo 1.26\n",
		"dep/dep.go":             "package dep\n\nconst Word = \"alpha\"\n",
		"cmd/hello/main.go":      "package main\n\nimport (\n\t_ \"embed\"\n\t\"os\"\n\n\t\"example.com/app/greet\"\n\t\"example.com/dep\"\n)\n\n//go:embed msg.txt\nvar msg string\n\nfunc main() { os.Stdout.WriteString(greet.Word + \" \" + dep.Word + \" \" + msg + extra) }\n",
		"cmd/hello/extra.go":     "package main\n\nvar extra = \"\"\n",
		"cmd/hello/v3.go":        "//go:build amd64.v3\n\npackage main\n\nfunc init() { extra += \" v3\" }\n",
		"cmd/hello/jsonv2.go":    "//go:build goexperiment.jsonv2\n\npackage main\n\nfunc init() { extra += \" jsonv2\" }\n",
		"cmd/hello/msg.txt":      "first",
		"greet/greet.go":         "package greet\n\nconst Word = \"one\"\n",
		"cmd/other/main.go":      "package main\n\nimport \"example.com/app/greet\"\n\nfunc main() { println(greet.Word) }\n",
		"cmd/other/unrelated.go": "package main\n",
	})
	// Vendored: the dependency comes from vendor/, through the vendor
	// archive.
	vendor := exec.Command("go", "mod", "vendor")
	vendor.Dir, vendor.Env = app, append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := vendor.CombinedOutput(); err != nil {
		t.Fatalf("go mod vendor: %v\n%s", err, out)
	}
	git := func(args ...string) string { return testdaemon.Git(t, app, args...) }
	git("init", "-q")
	git("add", "-A")
	git("commit", "-qm", "one")
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	rel := func(name string) string { return filepath.Join(app, filepath.FromSlash(name)) }
	// Every write dates the file an hour back, a second later each time,
	// as a checkout of old files does; BuildKit's transfer sends a file
	// again only when its size or time differ.
	writes := 0
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(rel(name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		writes++
		at := past.Add(time.Duration(writes) * time.Second)
		if err := os.Chtimes(rel(name), at, at); err != nil {
			t.Fatal(err)
		}
	}
	// keepStat writes body with the size and modification time name had.
	keepStat := func(name, body string) {
		t.Helper()
		fi, err := os.Stat(rel(name))
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(body)) != fi.Size() {
			t.Fatalf("%s: the edit must keep the size %d, has %d", name, fi.Size(), len(body))
		}
		if err := os.WriteFile(rel(name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(rel(name), fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	pkgs := []string{"./cmd/hello", "./cmd/other"}
	digests := func(dir string) map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, name := range []string{"hello", "other"} {
			data, err := os.ReadFile(filepath.Join(dir, "linux_amd64", name))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			got[name] = hex.EncodeToString(sum[:8])
		}
		return got
	}
	// The configuration a build takes (toolchain, Go environment): this
	// repository's, until a scenario edits a copy of it.
	root := testdaemon.RepoRoot(t)
	build := func(root, module, into string, rebuild bool) map[string]string {
		t.Helper()
		res, err := Binaries(context.Background(), Options{Root: root, Module: module, Packages: pkgs,
			Platforms: "linux/amd64", OutDir: into, Progress: "quiet", Rebuild: rebuild})
		if err != nil {
			t.Fatal(err)
		}
		return digests(res.Dir)
	}
	build(root, app, out, false)

	type run struct {
		name string
		env  map[string]string
		root string
		tree string
		got  map[string]string
	}
	var runs []run
	for _, sc := range []struct {
		name string
		do   func(t *testing.T)
		env  map[string]string
	}{
		{name: "nothing changed", do: func(*testing.T) {}},
		{name: "a source edited", do: func(*testing.T) { write("greet/greet.go", "package greet\n\nconst Word = \"two\"\n") }},
		{name: "a source edited keeping size and time (cp -p)", do: func(*testing.T) { keepStat("greet/greet.go", "package greet\n\nconst Word = \"six\"\n") }},
		{name: "the edit reverted keeping time", do: func(*testing.T) { keepStat("greet/greet.go", "package greet\n\nconst Word = \"two\"\n") }},
		{name: "a file added to a package", do: func(*testing.T) {
			write("cmd/hello/added.go", "package main\n\nfunc init() { extra += \" added\" }\n")
		}},
		{name: "a file removed from a package", do: func(t *testing.T) { os.Remove(rel("cmd/hello/added.go")) }},
		{name: "an embedded file edited", do: func(*testing.T) { write("cmd/hello/msg.txt", "second") }},
		{name: "an embedded file edited keeping size and time", do: func(*testing.T) { keepStat("cmd/hello/msg.txt", "thirds") }},
		{name: "a vendored file edited", do: func(*testing.T) {
			write("vendor/example.com/dep/dep.go", "package dep\n\nconst Word = \"delta\"\n")
		}},
		{name: "a vendored file edited keeping size and time", do: func(*testing.T) {
			keepStat("vendor/example.com/dep/dep.go", "package dep\n\nconst Word = \"gamma\"\n")
		}},
		{name: "GOAMD64 set in the shell", env: map[string]string{"GOAMD64": "v3"}, do: func(*testing.T) {}},
		{name: "GOEXPERIMENT set in the shell", env: map[string]string{"GOEXPERIMENT": "jsonv2"}, do: func(*testing.T) {}},
		{name: "GOFLAGS set in the shell", env: map[string]string{"GOFLAGS": "-tags=amd64.v3"}, do: func(*testing.T) {}},
		{name: "CGO_ENABLED set in the shell", env: map[string]string{"CGO_ENABLED": "1"}, do: func(*testing.T) {}},
		{name: "go.env in kiln.yaml asks for GOAMD64=v3", do: func(t *testing.T) {
			copied := t.TempDir()
			testdaemon.CopyTree(t, root, copied)
			kiln := filepath.Join(copied, "build", "kiln.yaml")
			data, err := os.ReadFile(kiln)
			if err != nil {
				t.Fatal(err)
			}
			edited := strings.Replace(string(data), "\ngo:\n", "\ngo:\n  env: {GOAMD64: v3}\n", 1)
			if edited == string(data) {
				t.Fatal("no go: section in build/kiln.yaml")
			}
			if err := os.WriteFile(kiln, []byte(edited), 0o644); err != nil {
				t.Fatal(err)
			}
			root = copied
		}},
		{name: "a file only go.env's GOAMD64 chooses edited", do: func(*testing.T) {
			write("cmd/hello/v3.go", "//go:build amd64.v3\n\npackage main\n\nfunc init() { extra += \" v3!\" }\n")
		}},
		{name: "a binary in the output replaced by hand", do: func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(out, "bin", "linux_amd64", "hello"), []byte("#!/bin/sh\necho tampered\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a binary in the output truncated", do: func(t *testing.T) {
			if err := os.Truncate(filepath.Join(out, "bin", "linux_amd64", "other"), 100); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a binary's bytes flipped keeping size and time", do: func(t *testing.T) {
			path := filepath.Join(out, "bin", "linux_amd64", "hello")
			fi, _ := os.Stat(path)
			data, _ := os.ReadFile(path)
			data[len(data)/2] ^= 0xff
			os.WriteFile(path, data, 0o755)
			os.Chtimes(path, fi.ModTime(), fi.ModTime())
		}},
		{name: "an older commit checked out", do: func(t *testing.T) {
			git("add", "-A")
			git("commit", "-qm", "two")
			git("checkout", "-q", "HEAD~1")
		}},
		{name: "and back", do: func(t *testing.T) { git("checkout", "-q", "-") }},
		{name: "an old file time put back on an edited file", do: func(t *testing.T) {
			write("greet/greet.go", "package greet\n\nconst Word = \"ten\"\n")
			os.Chtimes(rel("greet/greet.go"), past, past) // older than any build
		}},
	} {
		for k, v := range sc.env {
			t.Setenv(k, v)
		}
		sc.do(t)
		// The tree as it is now, for its clean build after the others:
		// a copy, every file new to the daemon's transfer of the sources.
		snapshot := t.TempDir()
		testdaemon.CopyTree(t, app, snapshot)
		runs = append(runs, run{name: sc.name, env: sc.env, root: root, tree: snapshot, got: build(root, app, out, false)})
		for k := range sc.env {
			os.Unsetenv(k)
		}
	}
	for _, r := range runs {
		for k, v := range r.env {
			t.Setenv(k, v)
		}
		want := build(r.root, r.tree, t.TempDir(), true)
		verdict := "fresh"
		if r.got["hello"] != want["hello"] || r.got["other"] != want["other"] {
			verdict = "STALE"
			t.Errorf("%s: the build kept %v where a clean build writes %v", r.name, r.got, want)
		}
		t.Logf("%-5s %s", verdict, r.name)
		for k := range r.env {
			os.Unsetenv(k)
		}
	}
	// The output a user runs is the clean build's.
	if got, err := exec.Command(filepath.Join(out, "bin", "linux_amd64", "hello")).Output(); err != nil || !strings.HasPrefix(string(got), "ten gamma thirds v3!") {
		t.Errorf("hello printed %q (%v), want the last edits", got, err)
	}
}
