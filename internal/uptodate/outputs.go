package uptodate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/kiln-build/kiln/internal/atomicfile"
)

// An output is up to date when the inputs that made it are the inputs of
// this build and the files it wrote are still the ones it wrote. Builds are
// reproducible (tests prove it), so the same inputs would write the same
// bytes: kiln then skips the solve and the export, as Bazel skips an action
// whose key it has seen. The key holds every input explain tracks (each
// file the go command reads, the toolchain pin, stamps, flags, modules, the
// LLB definitions, image.yaml and its files) and kiln's own executable, so a
// kiln upgrade rebuilds once.

// OutputsFile is the name of the record of written outputs.
const OutputsFile = "up-to-date.json"

// OutputRecord is what one written output was made of.
type OutputRecord struct {
	Key    string          `json:"key"`
	Files  map[string]Stat `json:"files"`
	Digest string          `json:"digest,omitempty"`
}

// OutputKey is the key of an output made from these steps' inputs; false
// when a step is not tracked, and the output must always be built.
func OutputKey(kind, name string, inputs map[string]map[string]string, steps []string, extra ...string) (string, bool) {
	exe, ok := ExecutableDigest()
	if !ok {
		return "", false
	}
	h := sha256.New()
	fmt.Fprintf(h, "kiln %s\n%s %s\n", exe, kind, name)
	for _, e := range extra {
		fmt.Fprintf(h, "%s\n", e)
	}
	for _, st := range steps {
		in, ok := inputs[st]
		if !ok {
			return "", false
		}
		fmt.Fprintf(h, "step %s\n", st)
		for _, k := range slices.Sorted(maps.Keys(in)) {
			fmt.Fprintf(h, "\t%s=%s\n", k, in[k])
		}
	}
	return hex.EncodeToString(h.Sum(nil)), true
}

// Outputs is the record file of one output directory.
type Outputs struct {
	path    string
	records map[string]OutputRecord
}

// ReadOutputs reads the record at path; a missing or unreadable one is
// empty.
func ReadOutputs(path string) *Outputs {
	u := &Outputs{path: path, records: map[string]OutputRecord{}}
	var r map[string]OutputRecord
	if data, err := os.ReadFile(path); err == nil && json.Unmarshal(data, &r) == nil && r != nil {
		u.records = r
	}
	return u
}

// Current returns the record of output name when key made it and its files
// are untouched.
func (u *Outputs) Current(name, key string) (OutputRecord, bool) {
	r, ok := u.records[name]
	if !ok || key == "" || r.Key != key || len(r.Files) == 0 {
		return OutputRecord{}, false
	}
	for path, want := range r.Files {
		if got, ok := StatFile(path); !ok || got != want {
			return OutputRecord{}, false
		}
	}
	return r, true
}

// Written is how kiln last wrote output name's files, whatever made them.
func (u *Outputs) Written(name string) map[string]Stat { return u.records[name].Files }

// Set records output name as made by key, and returns the record; with an
// empty key it forgets it.
func (u *Outputs) Set(name, key, digest string, files []string) OutputRecord {
	if key == "" {
		delete(u.records, name)
		return OutputRecord{}
	}
	r := OutputRecord{Key: key, Digest: digest, Files: map[string]Stat{}}
	for _, f := range files {
		st, ok := StatFile(f)
		if !ok {
			delete(u.records, name)
			return OutputRecord{}
		}
		r.Files[f] = st
	}
	u.records[name] = r
	return r
}

// Write replaces the record file.
func (u *Outputs) Write() error {
	return atomicfile.Write(u.path, func(w io.Writer) error { return json.NewEncoder(w).Encode(u.records) })
}
