package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestBlankedBuildIDsMakeDeadCodeInvisible links a program twice, the
// second time with a variable the linker drops: the binaries differ only
// in their build IDs, and are equal once blanked, on ELF and on PE; the
// blanked ELF binary still runs.
func TestBlankedBuildIDsMakeDeadCodeInvisible(t *testing.T) {
	if testing.Short() {
		t.Skip("links four programs")
	}
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module blank\n\ngo 1.26\n")
	write("main.go", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"blanked\") }\n")
	link := func(goos, out string) string {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH=amd64", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return filepath.Join(dir, out)
	}
	before := map[string]string{"linux": link("linux", "a"), "windows": link("windows", "a.exe")}
	write("main.go", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"blanked\") }\n\nvar dropped = 1\n")
	after := map[string]string{"linux": link("linux", "b"), "windows": link("windows", "b.exe")}
	for goos := range before {
		a, _ := os.ReadFile(before[goos])
		b, _ := os.ReadFile(after[goos])
		if bytes.Equal(a, b) {
			t.Fatalf("%s: the dead code changed no byte: this test proves nothing", goos)
		}
		if ids := buildIDs(a); len(ids) == 0 || bytes.Equal(ids[0], buildIDs(b)[0]) {
			t.Fatalf("%s: build IDs %q and %q", goos, ids, buildIDs(b))
		}
		for _, f := range []string{before[goos], after[goos]} {
			if err := copyBlankingBuildID(f, f+".blank"); err != nil {
				t.Fatal(err)
			}
		}
		a, _ = os.ReadFile(before[goos] + ".blank")
		b, _ = os.ReadFile(after[goos] + ".blank")
		if !bytes.Equal(a, b) {
			t.Errorf("%s: the blanked binaries differ", goos)
		}
		for _, id := range buildIDs(a) {
			if len(bytes.Trim(id, "\x00")) != 0 {
				t.Errorf("%s: a build ID is left: %q", goos, id)
			}
		}
	}
	out, err := exec.Command(before["linux"] + ".blank").Output()
	if err != nil || string(out) != "blanked\n" {
		t.Errorf("the blanked binary ran: %q, %v", out, err)
	}
}
