package plan

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kiln-build/kiln/internal/uptodate"
)

// TestListRecordsRoundTrip: a record reads back as written, paths with
// spaces included; a record cut short, or of another format, reads as none;
// one a line could not hold is not written.
func TestListRecordsRoundTrip(t *testing.T) {
	rec := &listRecord{
		Out:        "{\n\t\"ImportPath\": \"example.com/a b\"\n}\nf 1 2 3 not a line\n",
		RecordedAt: 1796549062746106291,
		Files: map[string]fileHead{
			"/src/a b/x.go": {Stat: uptodate.Stat{Size: 120, ModTime: 1796549060000000001, Change: 1796549061000000002, Inode: 4242}, Head: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
			"/src/go.mod":   {Stat: uptodate.Stat{Size: 0, ModTime: -1}, Head: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		},
		Dirs: map[string]string{"/src/a b": "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"},
	}
	data, ok := encodeListRecord(rec)
	if !ok {
		t.Fatal("a record with plain paths was not encoded")
	}
	if got := decodeListRecord(data); !reflect.DeepEqual(got, rec) {
		t.Errorf("read back %+v\nwant %+v", got, rec)
	}
	for cut := range len(data) {
		if got := decodeListRecord(data[:cut]); got != nil {
			t.Fatalf("a record cut at byte %d of %d read as %+v", cut, len(data), got)
		}
	}
	if got := decodeListRecord(append(slices.Clone(data), "}\n"...)); got != nil {
		t.Errorf("a record with more output than it says read as %+v", got)
	}
	header, _, _ := bytes.Cut(data, []byte("\n"))
	for _, bad := range []string{string(header) + " junk", listRecordHeader + " 1 999999999999 0 0", listRecordHeader + " 1 -1 0 0"} {
		if got := decodeListRecord([]byte(bad + "\n")); got != nil {
			t.Errorf("header %q read as %+v", bad, got)
		}
	}
	if got := decodeListRecord([]byte(`{"recordedAt":1,"files":{},"dirs":{}}` + "\n" + rec.Out)); got != nil {
		t.Errorf("a record of the JSON format read as %+v", got)
	}
	for name, change := range map[string]func(r *listRecord){
		"a file path holding a newline": func(r *listRecord) { r.Files["/src/new\nline.go"] = fileHead{Head: "00"} },
		"a head holding a space":        func(r *listRecord) { r.Files["/src/x.go"] = fileHead{Head: "00 11"} },
		"a folder holding a newline":    func(r *listRecord) { r.Dirs["/src/new\nline"] = "00" },
		"a listing holding a space":     func(r *listRecord) { r.Dirs["/src/y"] = "00 11" },
	} {
		bad := &listRecord{Out: rec.Out, Files: maps.Clone(rec.Files), Dirs: maps.Clone(rec.Dirs)}
		change(bad)
		if _, ok := encodeListRecord(bad); ok {
			t.Errorf("a record with %s was encoded", name)
		}
	}
}

// TestTheListCacheSeesAnImportEditedKeepingSizeAndTime: an import changed
// with the file's size and modification time kept (cp -p, touch -r) is
// seen by its change time, and go list runs again, without go's own index
// of package folders, which trusts size and time: the binary's files are
// the new import's.
func TestTheListCacheSeesAnImportEditedKeepingSizeAndTime(t *testing.T) {
	window := uptodate.RacyWindow
	uptodate.RacyWindow = 0
	t.Cleanup(func() { uptodate.RacyWindow = window })
	source := func(pkg string) string {
		return "package main\n\nimport _ \"example.com/app/" + pkg + "\"\n\nfunc main() {}\n"
	}
	app, resolve := helloModule(t, map[string]string{
		"go.mod":            "module example.com/app\n\ngo 1.26\n",
		"pka/a.go":          "package pka\n",
		"pkb/b.go":          "package pkb\n",
		"cmd/hello/main.go": source("pka"),
	})
	main := filepath.Join(app, "cmd", "hello", "main.go")
	old := time.Now().Add(-time.Hour)
	os.Chtimes(main, old, old)
	cache := t.TempDir()
	files := func() []string {
		t.Helper()
		return resolve(nil, Options{ListCache: cache}).Binary("hello").Files
	}
	time.Sleep(10 * time.Millisecond)
	if got := files(); !slices.Contains(got, "pka/a.go") {
		t.Fatalf("files %v, want pka's", got)
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(main, []byte(source("pkb")), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(main, old, old)
	if got := files(); !slices.Contains(got, "pkb/b.go") || slices.Contains(got, "pka/a.go") {
		t.Errorf("after the import changed with size and time kept: files %v, want pkb's alone", got)
	}
}
