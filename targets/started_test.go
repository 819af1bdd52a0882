package targets

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTheTargetsSeeTheUsersGOFLAGS: mage.go hands mage GOFLAGS with -find
// added, which breaks every go list -deps kiln runs; the targets see the
// user's own again, set, empty or unset as it was.
func TestTheTargetsSeeTheUsersGOFLAGS(t *testing.T) {
	for _, c := range []struct {
		saved, want string
		set         bool
	}{
		{"='-gcflags=all=-N -l' -mod=mod", "'-gcflags=all=-N -l' -mod=mod", true},
		{"=", "", true},
		{"unset", "", false},
	} {
		t.Setenv("GOFLAGS", c.want+" -find")
		t.Setenv("KILN_MAGE_GOFLAGS", c.saved)
		restoreMageEnv()
		got, set := os.LookupEnv("GOFLAGS")
		if got != c.want || set != c.set {
			t.Errorf("KILN_MAGE_GOFLAGS %q: GOFLAGS %q (set %v), want %q (set %v)", c.saved, got, set, c.want, c.set)
		}
		if _, left := os.LookupEnv("KILN_MAGE_GOFLAGS"); left {
			t.Errorf("KILN_MAGE_GOFLAGS %q was left for the build to see", c.saved)
		}
	}
}

// TestTheTargetsRecordWhatMageGoReads: mage.go, a file of its own that
// cannot import this package, reads the record the targets write when they
// start. Both name the same fields; the record names the running binary,
// and only one in the record's folder, mage's cache.
func TestTheTargetsRecordWhatMageGoReads(t *testing.T) {
	elsewhere := filepath.Join(t.TempDir(), "kiln-targets-test.json")
	recordTargets(elsewhere, "fingerprint")
	if _, err := os.Stat(elsewhere); err == nil {
		t.Errorf("a record beside no targets binary was written: %s", elsewhere)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stamp := filepath.Join(filepath.Dir(exe), "kiln-targets-test.json")
	t.Cleanup(func() { os.Remove(stamp) })
	recordTargets(stamp, "fingerprint")
	data, err := os.ReadFile(stamp)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	if rec["Exe"] != exe || rec["Fingerprint"] != "fingerprint" || rec["File"] == "" {
		t.Errorf("record %s, want the running binary %s", data, exe)
	}

	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "mage.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "targetsStamp" {
			for _, field := range ts.Type.(*ast.StructType).Fields.List {
				for _, name := range field.Names {
					read = append(read, name.Name)
				}
			}
		}
		return true
	})
	slices.Sort(read)
	if written := slices.Sorted(maps.Keys(rec)); !slices.Equal(written, read) {
		t.Errorf("the targets write %v, mage.go reads %v", written, read)
	}
}
