package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-build/kiln/targets/internal/magerun"
)

// TestARecordIsTrustedOnlyWhileItHolds: the record the targets write (here
// the test binary's own) names a binary to run without mage only for the
// fingerprint it was written for, while the binary is unchanged and no one
// else could have written the record.
func TestARecordIsTrustedOnlyWhileItHolds(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stamp := filepath.Join(filepath.Dir(exe), "kiln-targets-test.json")
	t.Cleanup(func() { os.Remove(stamp) })
	expect := func(fingerprint, why string) {
		t.Helper()
		got, gotWhy := upToDate(stamp, fingerprint)
		if why == "" && (got != exe || gotWhy != "") || why != "" && (got != "" || !strings.Contains(gotWhy, why)) {
			t.Errorf("upToDate(%s): %q, %q; want %q", fingerprint, got, gotWhy, why)
		}
	}
	expect("a", "no record")
	magerun.Write(stamp, "a")
	expect("a", "")
	expect("b", "changed since they last started")

	if err := os.Chmod(stamp, 0o666); err != nil {
		t.Fatal(err)
	}
	expect("a", "writable by others")
	if err := os.Chmod(stamp, 0o600); err != nil {
		t.Fatal(err)
	}

	info, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(exe, time.Time{}, info.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	expect("a", "binary changed")
	if err := os.Chtimes(exe, time.Time{}, info.ModTime()); err != nil {
		t.Fatal(err)
	}
	expect("a", "")

	// A record outside the binary's folder names nothing to run.
	other := filepath.Join(t.TempDir(), "kiln-targets-test.json")
	data, err := os.ReadFile(stamp)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, why := upToDate(other, "a"); got != "" || !strings.Contains(why, "not a record") {
		t.Errorf("a record outside mage's cache: %q, %q", got, why)
	}
}

// TestTheFingerprintSeesEveryInput: a file of magefiles/ or of a folder its
// go.mod replaces a module with changes the fingerprint, even rewritten
// with its old size and time; a file changed in the last 2 s, a go.work or
// a GOFLAGS naming a file leave none.
func TestTheFingerprintSeesEveryInput(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("magefiles/go.mod", "module m\n\nreplace (\n\texample.com/lib => ../lib // here\n\texample.com/far v1.0.0 => example.com/other v1.0.0\n)\n")
	write("magefiles/magefile.go", "package main\n")
	write("lib/lib.go", "package lib // 1\n")
	t.Chdir(root)
	t.Setenv("GOFLAGS", "")
	t.Setenv("GOWORK", "")

	if fp, why := inputsFingerprint(); fp != "" || !strings.Contains(why, "2 s") {
		t.Errorf("files just written: fingerprint %q (%s)", fp, why)
	}
	time.Sleep(2100 * time.Millisecond)
	first, why := inputsFingerprint()
	if again, _ := inputsFingerprint(); first == "" || again != first {
		t.Fatalf("fingerprints %q, %q (%s)", first, again, why)
	}

	// The replaced folder, rewritten with its old size and time.
	lib := filepath.Join(root, "lib/lib.go")
	info, err := os.Stat(lib)
	if err != nil {
		t.Fatal(err)
	}
	write("lib/lib.go", "package lib // 2\n")
	if err := os.Chtimes(lib, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2100 * time.Millisecond)
	if fp, why := inputsFingerprint(); fp == "" || fp == first {
		t.Errorf("after a rewrite of lib/lib.go: fingerprint %q (%s), before %q", fp, why, first)
	}

	t.Setenv("GOFLAGS", "-mod=mod -modfile=other.mod")
	if fp, why := inputsFingerprint(); fp != "" || !strings.Contains(why, "-modfile") {
		t.Errorf("GOFLAGS naming a file: fingerprint %q (%s)", fp, why)
	}
	t.Setenv("GOFLAGS", "")
	write("go.work", "go 1.26\n")
	if fp, why := inputsFingerprint(); fp != "" || !strings.Contains(why, "go.work") {
		t.Errorf("with a go.work: fingerprint %q (%s)", fp, why)
	}
}
