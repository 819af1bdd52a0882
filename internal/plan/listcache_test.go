package plan

import (
	"bytes"
	"maps"
	"reflect"
	"slices"
	"testing"
)

// TestListRecordsRoundTrip: a record reads back as written, paths with
// spaces included; a record cut short, or of another format, reads as none;
// one a line could not hold is not written.
func TestListRecordsRoundTrip(t *testing.T) {
	rec := &listRecord{
		Out:        "{\n\t\"ImportPath\": \"example.com/a b\"\n}\nf 1 2 3 not a line\n",
		RecordedAt: 1796549062746106291,
		Files: map[string]fileHead{
			"/src/a b/x.go": {Size: 120, ModTime: 1796549060000000001, Head: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
			"/src/go.mod":   {Size: 0, ModTime: -1, Head: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
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
