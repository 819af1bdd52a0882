package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestBlankedBuildIDsMakeDeadCodeInvisible links a program twice, the
// second time with a variable the linker drops. The ELF binaries differ in
// their build IDs alone and are equal once blanked, and the blanked binary
// runs. Other formats are copied unchanged (a Mach-O binary is signed over
// its build ID).
func TestBlankedBuildIDsMakeDeadCodeInvisible(t *testing.T) {
	if testing.Short() {
		t.Skip("links four programs")
	}
	dir := t.TempDir()
	const program = "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"blanked\") }\n"
	write := func(content string) {
		files := map[string]string{"go.mod": "module blank\n\ngo 1.26\n", "main.go": content}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	link := func(goos, out string) string {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH=amd64", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return filepath.Join(dir, out)
	}
	write(program)
	a, pe := link("linux", "a"), link("windows", "a.exe")
	write(program + "\nvar dropped = 1\n")
	b := link("linux", "b")
	for _, f := range []string{a, b, pe} {
		if _, err := copyBlankingBuildID(f, f+".copy"); err != nil {
			t.Fatal(err)
		}
	}
	read := func(f string) []byte {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if bytes.Equal(read(a), read(b)) {
		t.Fatal("the dead code changed no byte: this test proves nothing")
	}
	if !bytes.Equal(read(a+".copy"), read(b+".copy")) {
		t.Error("the blanked binaries differ")
	}
	f, err := elf.Open(a + ".copy")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spans, err := elfBuildIDs(f)
	if err != nil || len(spans) != 2 {
		t.Fatalf("build ID notes %v, %v; want the Go and the GNU one", spans, err)
	}
	copied := read(a + ".copy")
	for _, sp := range spans {
		if sp[1] <= sp[0] || len(bytes.Trim(copied[sp[0]:sp[1]], "\x00")) != 0 {
			t.Errorf("build ID bytes %d-%d left: %q", sp[0], sp[1], copied[sp[0]:sp[1]])
		}
	}
	if out, err := exec.Command(a + ".copy").Output(); err != nil || string(out) != "blanked\n" {
		t.Errorf("the blanked binary ran: %q, %v", out, err)
	}
	if !bytes.Equal(read(pe), read(pe+".copy")) {
		t.Error("a PE binary was changed")
	}
	if _, err := copyBlankingBuildID(filepath.Join(dir, "go.mod"), filepath.Join(dir, "x")); err != nil {
		t.Errorf("a file that is not ELF: %v", err)
	}
}

func TestGoBuildsSideBySideShareTheCPUs(t *testing.T) {
	args := []string{"/usr/local/go/bin/go", "build", "-trimpath", "-o", "/kiln/keep/", "./cmd/a"}
	t.Setenv("GOFLAGS", "-mod=vendor")
	if got := withParallelism(args, 1); !slices.Equal(got, args) {
		t.Errorf("alone: %v, want the arguments unchanged", got)
	}
	want := fmt.Sprintf("-p=%d", (runtime.GOMAXPROCS(0)+1)/2)
	if got := withParallelism(args, 2); len(got) != len(args)+1 || got[2] != want || !slices.Equal(got[3:], args[2:]) {
		t.Errorf("side by side: %v, want %s after build", got, want)
	}
	t.Setenv("GOFLAGS", "-mod=vendor -p=3")
	if got := withParallelism(args, 2); !slices.Equal(got, args) {
		t.Errorf("with -p in GOFLAGS: %v, want the arguments unchanged", got)
	}
}

// A binary go finds up to date leaves the step with the time of its link,
// though go touched it; a relinked one with the time of its new link.
func TestABinaryGoDidNotRelinkKeepsItsLinkTime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build six times")
	}
	// A Windows binary is not ELF: gobuild cannot read its build ID and
	// tells it by its bytes.
	for _, goos := range []string{"linux", "windows"} {
		t.Run(goos, func(t *testing.T) {
			src, keep := t.TempDir(), t.TempDir()
			name := "kept"
			if goos == "windows" {
				name += ".exe"
			}
			write := func(main string) {
				for name, data := range map[string]string{"go.mod": "module kept\n\ngo 1.26\n", "main.go": main} {
					if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			build := func() time.Time {
				t.Helper()
				out := t.TempDir()
				t.Chdir(src)
				t.Setenv("CGO_ENABLED", "0")
				t.Setenv("GOFLAGS", "")
				t.Setenv("GOOS", goos)
				if err := gobuild(keep, out, []string{name}, []string{"go", "build", "-trimpath", "-o", keep + "/", "."}); err != nil {
					t.Fatal(err)
				}
				fi, err := os.Stat(filepath.Join(out, name))
				if err != nil {
					t.Fatal(err)
				}
				return fi.ModTime()
			}
			write("package main\n\nfunc main() {}\n")
			first := build()
			if again := build(); !again.Equal(first) {
				t.Errorf("an up-to-date binary left the step at %v, linked at %v", again, first)
			}
			write("package main\n\nfunc main() { println() }\n")
			if relinked := build(); relinked.Equal(first) {
				t.Error("a relinked binary kept the time of the link before")
			}
		})
	}
}
