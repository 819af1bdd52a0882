package testdaemon

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/modfixture"
)

// CopyTree copies a repository for a test to edit, leaving out _output.
func CopyTree(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if rel == "_output" {
			return filepath.SkipDir
		}
		dst := filepath.Join(to, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		case d.Type().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, data, info.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// AppendLine appends text to a file of a test tree.
func AppendLine(t testing.TB, path, line string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(data, line...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// GrepTree returns a regular file under dir that contains needle.
func GrepTree(dir string, needle []byte) (string, bool) {
	var found string
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || found != "" || !info.Mode().IsRegular() || info.Size() > 64<<20 {
			return nil
		}
		if data, err := os.ReadFile(path); err == nil && bytes.Contains(data, needle) {
			found = path
		}
		return nil
	})
	return found, found != ""
}

// Git runs git in dir with a fixed author, committer and date.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
		"GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TaggedCopy copies the repository at from into a new git repository of
// one commit, tagged tag.
func TaggedCopy(t testing.TB, from, tag string) string {
	t.Helper()
	dir := t.TempDir()
	CopyTree(t, from, dir)
	os.RemoveAll(filepath.Join(dir, ".git"))
	Git(t, dir, "init", "-q")
	Git(t, dir, "add", "-A")
	Git(t, dir, "commit", "-qm", "release "+tag)
	Git(t, dir, "tag", tag)
	return dir
}

// TinyRepo is a repository of one image with one binary, which imports
// only its version package (and, from the standard library, the runtime),
// built for the platforms given (as
// kiln.yaml writes them, "[linux/amd64]") with this repository's pinned
// toolchain; one commit, tagged v1.0.0. A cold compile of a platform takes
// a few CPU-seconds, against forty for this repository's binaries: for
// tests whose property does not depend on what the build compiles.
func TinyRepo(t testing.TB, platforms string) string {
	t.Helper()
	cfg, err := os.ReadFile(filepath.Join(RepoRoot(t), "build", "kiln.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	toolchain := regexp.MustCompile(`(?ms)^toolchain:\n.*?\n\n`).Find(cfg)
	if toolchain == nil {
		t.Fatal("no toolchain section in build/kiln.yaml")
	}
	root := t.TempDir()
	modfixture.Write(t, root, map[string]string{
		"go.mod":                 "module example.com/tiny\n\ngo 1.26\n",
		"cmd/tiny/main.go":       "package main\n\nimport \"example.com/tiny/pkg/version\"\n\nfunc main() { println(version.Version) }\n",
		"pkg/version/version.go": "package version\n\nvar Version, GitCommit, GitTreeState string\n",
		"build/kiln.yaml": string(toolchain) + "platforms: " + platforms + "\nbinaries:\n  - {name: tiny, package: ./cmd/tiny}\n" +
			"stamp:\n  package: example.com/tiny/pkg/version\ncache: {gocache: kiln-gocache, gomodcache: kiln-gomodcache}\nrepository: tiny\ntag: latest\n",
		"images/tiny/image.yaml": "binaries: [tiny]\nentrypoint: [/usr/local/bin/tiny]\nuser: \"65532:65532\"\nworkdir: /\n",
	})
	Git(t, root, "init", "-q")
	Git(t, root, "add", "-A")
	Git(t, root, "commit", "-qm", "tiny")
	Git(t, root, "tag", "v1.0.0")
	return root
}

// MageBinary compiles this repository's magefile the way `go run mage.go`
// does, into a binary named mage (its help says "mage TARGET"), so a test
// that runs many targets pays for the go commands of go run once.
func MageBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mage")
	cmd := exec.Command("go", "run", "mage.go", "-compile", bin)
	cmd.Dir = RepoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mage -compile: %v\n%s", err, out)
	}
	return bin
}
