package session

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/modfixture"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// TestAnEditThatKeepsSizeAndModificationTimeIsBuilt: a source rewritten
// with its size and modification time kept (cp -p, touch -r, a restore
// that keeps times) is what the next build compiles. kiln sees the change
// time; BuildKit's file sync compares size and modification time only, so
// without the change time sent along it kept the old bytes and the build
// printed the old value, recorded under the new inputs' key.
func TestAnEditThatKeepsSizeAndModificationTimeIsBuilt(t *testing.T) {
	testdaemon.Shared(t)
	app, main := sayingModule(t, "one")
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	keepTime := func() {
		if err := os.Chtimes(main, past, past); err != nil {
			t.Fatal(err)
		}
	}
	keepTime()
	out := t.TempDir()
	for _, word := range []string{"one", "two", "one"} {
		if err := os.WriteFile(main, []byte(saying(word)), 0o644); err != nil {
			t.Fatal(err)
		}
		keepTime()
		b, err := buildModuleInto(t, out, app, "./cmd/hello")
		if err != nil {
			t.Fatal(err)
		}
		b.runs(t, "hello", word)
	}
}

// TestAnEditWhileTheDaemonReadsIsNeverRecordedAsBuilt: a source that
// changes between kiln reading it for the build's keys and the daemon
// reading it (a branch switched mid-build) leaves no record that the
// output was made from what the keys name; once the file is back as the
// keys had it, the next build builds it again.
func TestAnEditWhileTheDaemonReadsIsNeverRecordedAsBuilt(t *testing.T) {
	testdaemon.Shared(t)
	app, main := sayingModule(t, "one")
	write := func(word string) {
		if err := os.WriteFile(main, []byte(saying(word)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	build := func(want string) {
		t.Helper()
		b, err := buildModuleInto(t, out, app, "./cmd/hello")
		if err != nil {
			t.Fatal(err)
		}
		b.runs(t, "hello", want)
	}
	build("one")
	write("two")
	// Cleared even when the build fails: the daemon is shared.
	t.Cleanup(func() { testHookBeforeSolve = nil })
	testHookBeforeSolve = func() { write("six") }
	build("six") // the keys say two; the daemon read six
	testHookBeforeSolve = nil
	write("two")
	build("two")
}

// saying is a main package that prints word.
func saying(word string) string {
	return "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"" + word + "\\n\") }\n"
}

// sayingModule writes a module whose ./cmd/hello prints word, and returns
// its folder and the main file.
func sayingModule(t *testing.T, word string) (string, string) {
	t.Helper()
	app := t.TempDir()
	modfixture.Write(t, app, map[string]string{
		"go.mod":            "module example.com/app\n\ngo 1.26\n",
		"cmd/hello/main.go": saying(word),
	})
	return app, filepath.Join(app, "cmd", "hello", "main.go")
}
