package inspect

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func goBuild(t *testing.T, dir string, env ...string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bin")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestStaticPassesAKilnBuild builds, the way kiln does, a program that uses
// net, which links libc when cgo is on. The binaries kiln builds are checked
// by TestImagesIntegration's verify; this one compiles net's part of the
// standard library where antctl would compile net/http's and crypto's.
func TestStaticPassesAKilnBuild(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module netfixture\n\ngo 1.26\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(`package main

import (
	"net"
	"os"
)

func main() {
	addrs, _ := net.LookupHost("localhost")
	os.Stdout.WriteString(net.JoinHostPort(addrs[0], "80"))
}
`), 0o644)
	data := goBuild(t, dir, "CGO_ENABLED=0", "GOFLAGS=-trimpath")
	if r := Static("netfixture", "linux/amd64", data); !r.OK {
		t.Errorf("a CGO_ENABLED=0 -trimpath build fails: %v", r.Problems)
	}
}

func TestStaticNamesLibcOfACgoBinary(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is needed to build a cgo binary")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module cgofixture\n\ngo 1.26\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(`package main

// #include <stdio.h>
// static void hello() { puts("hello"); }
import "C"

func main() { C.hello() }
`), 0o644)
	data := goBuild(t, dir, "CGO_ENABLED=1", "GOFLAGS=-trimpath")
	r := Static("cgofixture", "linux/amd64", data)
	if r.OK {
		t.Fatal("a cgo binary passed the static check")
	}
	all := strings.Join(r.Problems, "\n")
	for _, want := range []string{"interpreter", "libc.so", "puts", "CGO_ENABLED=\"1\""} {
		if !strings.Contains(all, want) {
			t.Errorf("problems do not mention %q:\n%s", want, all)
		}
	}
}

func TestStaticRejectsNonELF(t *testing.T) {
	if r := Static("x", "linux/amd64", []byte("#!/bin/sh\necho hi\n")); r.OK || !strings.Contains(r.Problems[0], "not an ELF") {
		t.Errorf("a script passed: %+v", r)
	}
}
