package uptodate

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSourceHashesReadOnlyFilesWhoseStatChanged plants a digest in the
// record: it is answered while the file's stat is as recorded and long
// enough before the recording, and the file is read again otherwise.
func TestSourceHashesReadOnlyFilesWhoseStatChanged(t *testing.T) {
	root, out := t.TempDir(), t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kept.go", "package a // kept\n")
	write("edited.go", "package a // one\n")
	time.Sleep(20 * time.Millisecond)
	plant := func() {
		path := filepath.Join(out, SourceHashesFile)
		var rec sourceHashesRecord
		data, err := os.ReadFile(path)
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err != nil {
			t.Fatal(err)
		}
		f := rec.Files["kept.go"]
		f.Hash = "planted"
		rec.Files["kept.go"] = f
		if data, err = json.Marshal(rec); err == nil {
			err = os.WriteFile(path, data, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	hashAll := func() map[string]string {
		// As a session reads them: loaded beside the plan, stats taken
		// side by side.
		h := LoadSourceHashesAsync(filepath.Join(out, SourceHashesFile), root, Clock{}).Take(filepath.Join(out, SourceHashesFile), root, Clock{})
		h.Prestat([]string{"edited.go", "kept.go"})
		if len(h.stats) != 2 {
			t.Fatalf("prestat took %d stats of 2 files", len(h.stats))
		}
		got := map[string]string{}
		for _, name := range []string{"kept.go", "edited.go"} {
			d, err := h.Hash(name)
			if err != nil {
				t.Fatal(err)
			}
			got[name] = d
		}
		h.Save()
		return got
	}

	restore := trustRecentInputs()
	t.Cleanup(restore)
	hashAll()
	plant()
	// Same size and modification time: only the change time tells.
	info, err := os.Stat(filepath.Join(root, "edited.go"))
	if err != nil {
		t.Fatal(err)
	}
	write("edited.go", "package a // two\n")
	if err := os.Chtimes(filepath.Join(root, "edited.go"), info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	got := hashAll()
	if got["kept.go"] != "planted" {
		t.Errorf("kept.go, unchanged, was read again (%s): the record was not used", got["kept.go"])
	}
	if want := Digest([]byte("package a // two\n")); got["edited.go"] != want {
		t.Errorf("edited.go, rewritten with its size and time kept, hashed %s; want %s", got["edited.go"], want)
	}

	plant()
	// Recorded within the racy window of kept.go's last change: not trusted.
	// An hour's window, so that a stall of the machine cannot age it past.
	RacyWindow = time.Hour
	if got := hashAll(); got["kept.go"] != Digest([]byte("package a // kept\n")) {
		t.Errorf("kept.go was answered from a racy record: %s", got["kept.go"])
	}
}

// TestPendingSourceHashesServeTheirOwnFolder: a record loaded ahead for
// one output folder is never handed to a session that writes another.
func TestPendingSourceHashesServeTheirOwnFolder(t *testing.T) {
	root := t.TempDir()
	// Both files older than any record made below: one changed after a
	// record began is not trusted by the next load (racy).
	for _, name := range []string{"a.go", "b.go"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte("package a\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	first, second := filepath.Join(t.TempDir(), SourceHashesFile), filepath.Join(t.TempDir(), SourceHashesFile)
	restore := trustRecentInputs()
	t.Cleanup(restore)
	h := LoadSourceHashes(first, root, Clock{})
	if _, err := h.Hash("a.go"); err != nil {
		t.Fatal(err)
	}
	h.Save()
	pending := LoadSourceHashesAsync(first, root, Clock{})
	if got := pending.Take(second, root, Clock{}); len(got.was) != 0 || got.path != second {
		t.Errorf("a session writing %s got the record of %s (%d files, %s)", second, first, len(got.was), got.path)
	}
	got := pending.Take(first, root, Clock{})
	if len(got.was) != 1 {
		t.Errorf("the record loaded ahead for %s holds %d files; want 1", first, len(got.was))
	}
	for _, name := range []string{"a.go", "b.go"} {
		if _, err := got.Hash(name); err != nil {
			t.Fatal(err)
		}
	}
	got.Save()
	if again := pending.Take(first, root, Clock{}); len(again.was) != 2 {
		t.Errorf("taken again, the record of %s holds %d files; want the 2 saved since (read anew)", first, len(again.was))
	}
}

// trustRecentInputs lets a test trust a tree written a moment ago; the
// returned function restores the window.
func trustRecentInputs() func() {
	old := RacyWindow
	RacyWindow = 0
	return func() { RacyWindow = old }
}

// TestFileSystemClock: the racy window's clock is read where the outputs
// go: a file written there tells the file system's time, and is gone
// after. A file system whose clock lags the host's sets the time; with no
// such folder yet, the host's clock serves and no folder is made.
func TestFileSystemClock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "explain")
	before := time.Now()
	if got := FileSystemClock(dir); !got.OK || got.At.Before(before) {
		t.Errorf("with no outputs folder: %+v, want the host's clock after %v", got, before)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("reading the clock made %s: %v", dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lag := time.Now().Add(-time.Hour).Truncate(time.Second)
	statClock = func(f *os.File) (fs.FileInfo, error) {
		fi, err := f.Stat()
		return laggingInfo{fi, lag}, err
	}
	t.Cleanup(func() { statClock = (*os.File).Stat })
	if got := FileSystemClock(dir); !got.OK || !got.At.Equal(lag) {
		t.Errorf("on a file system an hour behind: %+v, want %v", got, lag)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the clock's file is left in %s: %v", dir, entries)
	}
}

// laggingInfo is a file's stat with the modification time of a file system
// whose clock is behind.
type laggingInfo struct {
	fs.FileInfo
	mod time.Time
}

func (i laggingInfo) ModTime() time.Time { return i.mod }
